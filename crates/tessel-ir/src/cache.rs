//! Kernel caches, the parts that do not depend on what is cached.
//!
//! - [`BuiltCache`]: the in-memory, bounded, least-recently-used cache of built programs
//!   (OpenCL programs, wgpu pipelines) by device and source.
//! - [`Fnv128`] and [`temp_suffix`]: the key hash and unique temporary-file names of the
//!   on-disk caches (the CPU backend's shared libraries, the CUDA backend's CUBINs). The
//!   file handling itself stays in each backend, which differs in what it writes (a
//!   compiler's output file, or bytes in memory) and in how it reports failures.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::{FxHashMap, FxHasher};

type Key = (usize, u64);

/// Built programs by device and a hash of their source, least recently used first.
///
/// A program is built for one device from one source, so the cache is keyed by the device
/// and a hash of the source; the source itself is kept (by the cached value, which
/// `source` reads) and compared on a hit, so a hash collision costs a rebuild, never a
/// wrong kernel. Beyond `capacity` entries the least recently used is dropped; whoever
/// still holds its `Arc` (a live program) keeps it.
pub struct BuiltCache<T> {
    map: FxHashMap<Key, Arc<T>>,
    order: VecDeque<Key>,
    capacity: usize,
    source: fn(&T) -> &str,
}

impl<T> BuiltCache<T> {
    /// An empty cache of at most `capacity` entries; `source` gives a value's source.
    pub fn new(capacity: usize, source: fn(&T) -> &str) -> Self {
        BuiltCache {
            map: FxHashMap::default(),
            order: VecDeque::new(),
            capacity,
            source,
        }
    }

    fn key(device: usize, source: &str) -> Key {
        let mut hasher = FxHasher::default();
        source.hash(&mut hasher);
        (device, hasher.finish())
    }

    /// The value built from `source` for `device`, if cached; marks it recently used.
    pub fn get(&mut self, device: usize, source: &str) -> Option<Arc<T>> {
        let key = Self::key(device, source);
        let built = self
            .map
            .get(&key)
            .filter(|b| (self.source)(b) == source)?
            .clone();
        if let Some(at) = self.order.iter().position(|k| *k == key) {
            self.order.remove(at);
        }
        self.order.push_back(key);
        Some(built)
    }

    /// Keeps `built` for `device`, evicting the least recently used beyond capacity.
    pub fn insert(&mut self, device: usize, built: Arc<T>) {
        let key = Self::key(device, (self.source)(&built));
        if self.map.insert(key, built).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    /// How many values are cached.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// 128-bit FNV-1a, the key of disk-cached kernels.
///
/// The key must be the same in every process and every build, since other processes look
/// kernels up by it: `std`'s `DefaultHasher` is randomly seeded per process and its
/// algorithm may change between Rust releases, so it cannot be used. 128 bits make an
/// accidental collision (which would load the wrong kernel) negligible.
#[derive(Clone, Debug)]
pub struct Fnv128(u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    /// The hash of nothing.
    pub fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    /// Hashes `bytes` as they are.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// Hashes a length-prefixed field, so that ("ab", "c") and ("a", "bc") hash differently.
    pub fn field(&mut self, bytes: &[u8]) {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes);
    }

    /// The hash so far.
    pub fn finish(&self) -> u128 {
        self.0
    }
}

/// A file-name suffix no other writer uses at the same time: the process id and a
/// process-wide counter, ending in `.tmp`. Cache files are written under such a name and
/// then renamed into place, so a concurrent reader sees either no file or a whole one.
pub fn temp_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The text stored under `key` in the cache folder `dir` (one file per key, named by its
/// 32 hex digits), if there is one.
pub fn read_keyed(dir: &std::path::Path, key: u128) -> Option<String> {
    std::fs::read_to_string(dir.join(format!("{key:032x}"))).ok()
}

/// Stores `text` under `key` in the cache folder `dir` (created if missing): written under
/// a [`temp_suffix`] name, then renamed into place, so readers never see half a file.
pub fn write_keyed(dir: &std::path::Path, key: u128, text: &str) -> std::io::Result<()> {
    let path = dir.join(format!("{key:032x}"));
    let temp = dir.join(format!("{key:032x}.{}", temp_suffix()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&temp, text))
        .and_then(|()| std::fs::rename(&temp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Removes the least recently written files of the cache folder `dir` beyond the newest
/// `keep`, so a cache whose keys change (with every build, say) stays bounded. Errors
/// are ignored: a file another process removed first is gone either way.
pub fn keep_newest(dir: &std::path::Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let meta = e.metadata().ok()?;
            if !meta.is_file() {
                return None;
            }
            Some((meta.modified().ok()?, e.path()))
        })
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
    for (_, path) in files.drain(keep..) {
        let _ = std::fs::remove_file(path);
    }
}

/// The root of Tessel's on-disk caches: `$TESSEL_CACHE_DIR`, else `$XDG_CACHE_HOME/tessel`,
/// else `$HOME/.cache/tessel`, else the temporary directory's `tessel`.
pub fn default_root() -> std::path::PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    var("TESSEL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tessel")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tessel")))
        .unwrap_or_else(|| std::env::temp_dir().join("tessel"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{BuiltCache, Fnv128, keep_newest, temp_suffix, write_keyed};

    #[test]
    fn a_bounded_folder_keeps_its_newest_files() {
        let dir = std::env::temp_dir().join(format!("tessel-keep-newest-{}", temp_suffix()));
        for key in 0..5u128 {
            write_keyed(&dir, key, "x").unwrap();
            let file = std::fs::File::options()
                .write(true)
                .open(dir.join(format!("{key:032x}")))
                .unwrap();
            let when =
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + key as u64);
            file.set_modified(when).unwrap();
        }
        keep_newest(&dir, 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [format!("{:032x}", 3), format!("{:032x}", 4)]);
        keep_newest(&dir.join("missing"), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn built_cache_separates_devices_and_sources_and_evicts_lru() {
        let a = BuiltCache::<String>::key(0, "kernel a");
        assert_ne!(a, BuiltCache::<String>::key(1, "kernel a"));
        assert_ne!(a, BuiltCache::<String>::key(0, "kernel b"));
        assert_eq!(a, BuiltCache::<String>::key(0, "kernel a"));
        let mut cache = BuiltCache::new(2, String::as_str);
        assert!(cache.is_empty());
        for s in ["a", "b"] {
            cache.insert(0, Arc::new(s.to_owned()));
        }
        assert!(cache.get(1, "a").is_none(), "devices are separate");
        assert_eq!(cache.get(0, "a").as_deref().map(String::as_str), Some("a"));
        cache.insert(0, Arc::new("c".to_owned()));
        assert_eq!(cache.len(), 2);
        assert!(
            cache.get(0, "b").is_none(),
            "the least recently used goes first"
        );
        assert!(cache.get(0, "a").is_some() && cache.get(0, "c").is_some());
    }

    #[test]
    fn fnv128_matches_the_reference() {
        // Test vectors of the FNV reference implementation.
        let hash = |s: &str| {
            let mut h = Fnv128::new();
            h.bytes(s.as_bytes());
            h.finish()
        };
        assert_eq!(hash(""), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
        assert_eq!(hash("a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
    }

    #[test]
    fn fields_are_delimited() {
        let hash = |parts: &[&str]| {
            let mut h = Fnv128::new();
            for p in parts {
                h.field(p.as_bytes());
            }
            h.finish()
        };
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }

    #[test]
    fn temp_suffixes_differ() {
        assert_ne!(temp_suffix(), temp_suffix());
    }
}
