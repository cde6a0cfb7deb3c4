//! The TCP transport: every rank connects to rank 0 (a star), and each collective is a
//! gather at rank 0 followed by a send of the result to every rank.
//!
//! Rank 0 checks that every rank called the same collective (kind, sequence number, dtype,
//! element count, reduce op or root) before computing anything; a mismatch, a rank that
//! closes its connection, or one that sends nothing within the timeout ends the collective
//! with an [`Error::Collective`] on every rank still listening, never a hang. Reductions run at
//! rank 0 in rank order, so results are the same on every rank and in every run.
//!
//! A star moves `2·(world − 1)` copies of the data through rank 0: fine for a few processes
//! on one host (what the launcher example starts); a ring would scale further.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessel_tensor::{DType, Error, Result};

use crate::group::Collective;
use crate::reduce::{ReduceOp, reduce};

/// Frame magic and protocol version.
const MAGIC: [u8; 4] = *b"TSC1";
const HEADER: usize = 40;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hello = 1,
    Welcome = 2,
    AllReduce = 3,
    Broadcast = 4,
    AllGather = 5,
    Barrier = 6,
    Failed = 255,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        [
            Kind::Hello,
            Kind::Welcome,
            Kind::AllReduce,
            Kind::Broadcast,
            Kind::AllGather,
            Kind::Barrier,
            Kind::Failed,
        ]
        .into_iter()
        .find(|k| *k as u8 == b)
    }

    fn op(self) -> &'static str {
        match self {
            Kind::Hello | Kind::Welcome => "init_process_group",
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::Barrier => "barrier",
            Kind::Failed => "collective",
        }
    }
}

/// A frame's header: which collective, and what each rank must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: Kind,
    dtype: DType,
    seq: u64,
    elems: u64,
    /// The reduce op's code, the broadcast root, or the sender's rank (hello).
    aux: u64,
    payload: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = self.kind as u8;
        b[5] = DType::ALL
            .iter()
            .position(|d| *d == self.dtype)
            .unwrap_or(0) as u8;
        for (k, v) in [self.seq, self.elems, self.aux, self.payload]
            .iter()
            .enumerate()
        {
            b[8 + 8 * k..16 + 8 * k].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; HEADER]) -> Option<Header> {
        let word = |k: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 + 8 * k..16 + 8 * k]);
            u64::from_le_bytes(w)
        };
        (b[..4] == MAGIC).then_some(())?;
        Some(Header {
            kind: Kind::from_u8(b[4])?,
            dtype: *DType::ALL.get(b[5] as usize)?,
            seq: word(0),
            elems: word(1),
            aux: word(2),
            payload: word(3),
        })
    }

    /// What a mismatching rank is told.
    fn describe(&self) -> String {
        format!(
            "{} #{} of {} {} elements (aux {})",
            self.kind.op(),
            self.seq,
            self.elems,
            self.dtype,
            self.aux
        )
    }
}

/// The transport's connections: rank 0 holds one per other rank, the others one to rank 0.
struct Links {
    streams: Vec<TcpStream>,
    seq: u64,
    /// Set once a collective failed: every later one fails at once with this reason (the
    /// ranks no longer agree on where the stream of frames is).
    broken: Option<String>,
}

/// The TCP [`Collective`] (see the module docs).
pub(crate) struct TcpCollective {
    rank: usize,
    world: usize,
    timeout: Duration,
    links: Mutex<Links>,
}

impl TcpCollective {
    /// Joins the group at `addr` (rank 0 listens there, the others connect), waiting up to
    /// `timeout` for every rank to arrive.
    pub(crate) fn connect(
        addr: SocketAddr,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<TcpCollective> {
        let fail = |reason: String| Error::Collective {
            op: "init_process_group",
            reason,
        };
        let deadline = Instant::now() + timeout;
        let streams = if rank == 0 {
            let listener = TcpListener::bind(addr).map_err(|e| {
                fail(format!(
                    "rank 0 cannot listen on {addr}: {e}; pick a free MASTER_PORT"
                ))
            })?;
            listener
                .set_nonblocking(true)
                .map_err(|e| fail(format!("cannot poll the listener: {e}")))?;
            let mut by_rank: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
            let mut joined = 1;
            while joined < world {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let mut s = configure(stream, timeout).map_err(|e| fail(e.to_string()))?;
                        let hello = read_header(&mut s, "a joining process").map_err(fail)?;
                        let r = hello.aux as usize;
                        if hello.kind != Kind::Hello || hello.elems != world as u64 {
                            return Err(fail(format!(
                                "rank {r} joined a group of {} ranks, but rank 0 has WORLD_SIZE {world}",
                                hello.elems
                            )));
                        }
                        if r == 0 || r >= world || by_rank[r].is_some() {
                            return Err(fail(format!(
                                "a process joined as rank {r}: ranks must be 1..{world}, each once; check RANK"
                            )));
                        }
                        by_rank[r] = Some(s);
                        joined += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let missing: Vec<usize> =
                                (1..world).filter(|&r| by_rank[r].is_none()).collect();
                            return Err(fail(format!(
                                "ranks {missing:?} did not join within {:.0} s at {addr}",
                                timeout.as_secs_f64()
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(fail(format!("accepting at {addr}: {e}"))),
                }
            }
            let mut streams: Vec<TcpStream> = by_rank.into_iter().flatten().collect();
            let welcome = Header {
                kind: Kind::Welcome,
                dtype: DType::U8,
                seq: 0,
                elems: world as u64,
                aux: 0,
                payload: 0,
            };
            for (k, s) in streams.iter_mut().enumerate() {
                s.write_all(&welcome.encode())
                    .map_err(|e| fail(format!("welcoming rank {}: {e}", k + 1)))?;
            }
            streams
        } else {
            let mut stream = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        return Err(fail(format!(
                            "rank {rank} cannot reach rank 0 at {addr} within {:.0} s: {e}; check MASTER_ADDR and MASTER_PORT",
                            timeout.as_secs_f64()
                        )));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            stream = configure(stream, timeout).map_err(|e| fail(e.to_string()))?;
            let hello = Header {
                kind: Kind::Hello,
                dtype: DType::U8,
                seq: 0,
                elems: world as u64,
                aux: rank as u64,
                payload: 0,
            };
            stream
                .write_all(&hello.encode())
                .map_err(|e| fail(format!("greeting rank 0: {e}")))?;
            let welcome = read_header(&mut stream, "rank 0").map_err(fail)?;
            if welcome.kind != Kind::Welcome {
                return Err(fail(format!(
                    "rank 0 answered {:?} instead of a welcome",
                    welcome.kind
                )));
            }
            vec![stream]
        };
        tracing::debug!(target: "tessel::distributed", "rank {rank} of {world} joined at {addr}");
        Ok(TcpCollective {
            rank,
            world,
            timeout,
            links: Mutex::new(Links {
                streams,
                seq: 0,
                broken: None,
            }),
        })
    }

    /// One collective: every rank sends `(header, data)`; rank 0 checks the headers, calls
    /// `combine` on the payloads in rank order, and every rank returns what it computed.
    fn exchange(
        &self,
        mut header: Header,
        data: &[u8],
        combine: impl FnOnce(&[&[u8]]) -> Vec<u8>,
    ) -> Result<Vec<u8>> {
        let op = header.kind.op();
        let mut links = self
            .links
            .lock()
            .map_err(|_| Error::Internal("the collective's lock was poisoned".into()))?;
        if let Some(why) = &links.broken {
            return Err(Error::Collective {
                op,
                reason: format!("the group failed earlier and cannot be used again: {why}"),
            });
        }
        links.seq += 1;
        header.seq = links.seq;
        header.payload = data.len() as u64;
        let result = if self.rank == 0 {
            self.gather_and_answer(&mut links.streams, header, data, combine)
        } else {
            self.send_and_wait(&mut links.streams[0], header, data)
        };
        if let Err(why) = &result {
            links.broken = Some(why.clone());
        }
        result.map_err(|reason| Error::Collective { op, reason })
    }

    fn gather_and_answer(
        &self,
        streams: &mut [TcpStream],
        header: Header,
        data: &[u8],
        combine: impl FnOnce(&[&[u8]]) -> Vec<u8>,
    ) -> std::result::Result<Vec<u8>, String> {
        let mut payloads: Vec<Vec<u8>> = Vec::with_capacity(self.world - 1);
        let mut failure = None;
        for (k, stream) in streams.iter_mut().enumerate() {
            let r = k + 1;
            match read_frame(stream, r, self.timeout) {
                Ok((h, bytes)) if h.kind == Kind::Failed => {
                    failure = Some(format!(
                        "rank {r} failed: {}",
                        String::from_utf8_lossy(&bytes)
                    ));
                }
                Ok((h, bytes)) => {
                    let agrees = h.kind == header.kind
                        && h.seq == header.seq
                        && h.dtype == header.dtype
                        && h.elems == header.elems
                        && h.aux == header.aux;
                    if !agrees {
                        failure = Some(format!(
                            "rank {r} called {} while rank 0 called {}: every rank must call the same collectives in the same order with the same shapes",
                            h.describe(),
                            header.describe()
                        ));
                    } else if bytes.len() != data.len() {
                        // Every rank sends its own data of the agreed size.
                        failure = Some(format!(
                            "rank {r} sent {} bytes for {}, rank 0 has {}",
                            bytes.len(),
                            header.describe(),
                            data.len()
                        ));
                    }
                    payloads.push(bytes);
                }
                Err(e) => failure = Some(e),
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(why) = failure {
            // Tell every rank still listening, so none waits for an answer that never comes.
            let bytes = why.as_bytes();
            let failed = Header {
                kind: Kind::Failed,
                payload: bytes.len() as u64,
                ..header
            };
            for stream in streams.iter_mut() {
                let _ = stream
                    .write_all(&failed.encode())
                    .and_then(|()| stream.write_all(bytes));
            }
            return Err(why);
        }
        let mut parts: Vec<&[u8]> = vec![data];
        parts.extend(payloads.iter().map(Vec::as_slice));
        let out = combine(&parts);
        let answer = Header {
            payload: out.len() as u64,
            ..header
        };
        for (k, stream) in streams.iter_mut().enumerate() {
            stream
                .write_all(&answer.encode())
                .and_then(|()| stream.write_all(&out))
                .map_err(|e| describe_io(&e, k + 1, self.timeout))?;
        }
        Ok(out)
    }

    fn send_and_wait(
        &self,
        stream: &mut TcpStream,
        header: Header,
        data: &[u8],
    ) -> std::result::Result<Vec<u8>, String> {
        stream
            .write_all(&header.encode())
            .and_then(|()| stream.write_all(data))
            .map_err(|e| describe_io(&e, 0, self.timeout))?;
        let (h, bytes) = read_frame(stream, 0, self.timeout)?;
        if h.kind == Kind::Failed {
            return Err(String::from_utf8_lossy(&bytes).into_owned());
        }
        if h.kind != header.kind || h.seq != header.seq {
            return Err(format!(
                "rank 0 answered {} to {}",
                h.describe(),
                header.describe()
            ));
        }
        Ok(bytes)
    }
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&self, dtype: DType, data: &mut Vec<u8>, op: ReduceOp) -> Result<()> {
        let header = call(Kind::AllReduce, dtype, data.len(), op.code());
        *data = self.exchange(header, data, |parts| reduce(dtype, op, parts))?;
        Ok(())
    }

    fn broadcast(&self, dtype: DType, data: &mut Vec<u8>, root: usize) -> Result<()> {
        let header = call(Kind::Broadcast, dtype, data.len(), root as u64);
        *data = self.exchange(header, data, |parts| parts[root].to_vec())?;
        Ok(())
    }

    fn all_gather(&self, dtype: DType, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let header = call(Kind::AllGather, dtype, data.len(), 0);
        let all = self.exchange(header, data, |parts| parts.concat())?;
        if data.is_empty() {
            return Ok(vec![Vec::new(); self.world]);
        }
        Ok(all.chunks(data.len()).map(<[u8]>::to_vec).collect())
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(call(Kind::Barrier, DType::U8, 0, 0), &[], |_| Vec::new())
            .map(drop)
    }
}

/// The header of a collective call on `bytes` bytes of `dtype`.
fn call(kind: Kind, dtype: DType, bytes: usize, aux: u64) -> Header {
    Header {
        kind,
        dtype,
        seq: 0,
        elems: (bytes / dtype.size_bytes().max(1)) as u64,
        aux,
        payload: 0,
    }
}

fn configure(stream: TcpStream, timeout: Duration) -> io::Result<TcpStream> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// The handshake frame `who` sends.
fn read_header(stream: &mut TcpStream, who: &str) -> std::result::Result<Header, String> {
    let mut b = [0u8; HEADER];
    stream
        .read_exact(&mut b)
        .map_err(|e| format!("waiting for {who} to greet: {e}"))?;
    Header::decode(&b).ok_or_else(|| {
        format!("{who} sent a frame that is not Tessel's collective protocol (another program on MASTER_PORT, or another Tessel version)")
    })
}

fn read_frame(
    stream: &mut TcpStream,
    peer: usize,
    timeout: Duration,
) -> std::result::Result<(Header, Vec<u8>), String> {
    let mut b = [0u8; HEADER];
    stream
        .read_exact(&mut b)
        .map_err(|e| describe_io(&e, peer, timeout))?;
    let header = Header::decode(&b).ok_or_else(|| format!("rank {peer} sent a malformed frame"))?;
    let mut bytes =
        vec![0u8; usize::try_from(header.payload).map_err(|_| "frame too large".to_string())?];
    stream
        .read_exact(&mut bytes)
        .map_err(|e| describe_io(&e, peer, timeout))?;
    Ok((header, bytes))
}

/// An I/O failure talking to rank `peer`, as the user should read it.
fn describe_io(e: &io::Error, peer: usize, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "rank {peer} did not answer within {:.0} s (it may be stuck, or stopped calling collectives); raise the timeout with InitOptions::timeout if steps are that long",
            timeout.as_secs_f64()
        ),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => {
            format!("rank {peer} closed its connection (the process exited or crashed)")
        }
        _ => format!("talking to rank {peer}: {e}"),
    }
}
