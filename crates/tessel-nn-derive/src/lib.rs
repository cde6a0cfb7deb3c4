//! `#[derive(Module)]`: a module's `visit` written from its fields, so no parameter can be
//! left out of the optimizer or the weight file by a forgotten line.
//!
//! Every named field is visited under its own name, through `tessel_nn::VisitField`
//! (implemented for `Tensor`, every `Module`, `Option` and `Vec` of those), so a field of
//! another type is a compile error until it is marked `#[module(skip)]`. Attributes:
//! `#[module(rename = "name")]` (a weight name that is not a Rust field name, such as
//! `self` or `LayerNorm`), `#[module(buffer)]` (saved, not trained), `#[module(skip)]`; on the struct,
//! `#[module(crate = "path")]` names where `tessel_nn` is (found from the manifest otherwise).

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitStr, parse_macro_input};

/// Implements `tessel_nn::Module::visit` by visiting every field under its name.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// How one field is visited.
struct FieldPlan {
    ident: syn::Ident,
    name: String,
    buffer: bool,
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "derive(Module) needs a struct with named fields",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            input,
            "derive(Module) needs named fields: they name the weights",
        ));
    };
    let mut plans = Vec::new();
    for field in &fields.named {
        let ident = field.ident.clone().expect("named fields have names");
        let mut plan = FieldPlan {
            name: ident.to_string().trim_start_matches("r#").to_string(),
            ident,
            buffer: false,
        };
        let mut skip = false;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("module")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                } else if meta.path.is_ident("buffer") {
                    plan.buffer = true;
                } else if meta.path.is_ident("rename") {
                    plan.name = meta.value()?.parse::<LitStr>()?.value();
                } else {
                    return Err(meta.error("expected `skip`, `buffer` or `rename = \"...\"`"));
                }
                Ok(())
            })?;
        }
        if !skip {
            plans.push(plan);
        }
    }
    let krate = &crate_path(input)?;
    let visits = plans.iter().map(|p| {
        let (ident, name) = (&p.ident, &p.name);
        let kind = if p.buffer {
            quote!(#krate::ParamKind::Buffer)
        } else {
            quote!(#krate::ParamKind::Parameter)
        };
        quote! {
            #krate::VisitField::visit_field(&self.#ident, #name, #kind, v);
        }
    });
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics #krate::Module for #name #ty_generics #where_clause {
            fn visit(&self, v: &mut #krate::Visitor<'_>) {
                #(#visits)*
            }
        }
    })
}

/// The path of `tessel_nn` in the deriving crate: `#[module(crate = "path")]` on the struct;
/// else `::tessel::nn` for a crate that depends on the `tessel` facade but not on `tessel-nn`
/// (read from its manifest); else `::tessel_nn`.
fn crate_path(input: &DeriveInput) -> syn::Result<syn::Path> {
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        let mut path = None;
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                path = Some(meta.value()?.parse::<LitStr>()?.parse::<syn::Path>()?);
                Ok(())
            } else {
                Err(meta.error("expected `crate = \"path\"`"))
            }
        })?;
        if let Some(path) = path {
            return Ok(path);
        }
    }
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .ok()
        .and_then(|dir| std::fs::read_to_string(std::path::Path::new(&dir).join("Cargo.toml")).ok())
        .unwrap_or_default();
    let depends_on = |name: &str| {
        manifest.lines().any(|line| {
            line.trim_start()
                .strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with(['=', '.']))
        })
    };
    let path = if !depends_on("tessel-nn") && depends_on("tessel") {
        "::tessel::nn"
    } else {
        "::tessel_nn"
    };
    syn::parse_str(path)
}
