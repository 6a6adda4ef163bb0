//! Weight access by Hugging Face logical name (`layers.3.self_attn.q_proj.weight`, no
//! `model.` prefix) over safetensors (memory-mapped, single or sharded; matrices held as the
//! [`WeightsChoice`] says, quantized while loading) and GGUF (quantized matrices kept
//! quantized). Every lookup checks the shape and names the tensor on failure.

mod choice;
mod gguf;
pub(crate) mod gguf_check;
mod isq;
mod safetensors;
pub(crate) mod safetensors_check;

use std::collections::BTreeSet;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::contract::WeightFormat;
use crate::error::{EngineError, Result};
use crate::qmatmul::{from_qtensor, ggml_type, packed_bytes, PackedMatrix, QFormat};

pub use choice::{Held, WeightsChoice, WEIGHTS_CHOICES};
pub use gguf::gguf_name;

use crate::checkpoint::LoadOptions;

/// Logical names of the lookup tables (row reads; the token table is also the tied output
/// projection): held as [`WeightsChoice::table`] says.
const TABLES: [&str; 2] = ["embed_tokens.weight", "embed_tokens_per_layer.weight"];
/// The table only ever read by row (Gemma 4's per-layer token table): it stays in its
/// stored blocks, never repacked for the matmul kernels.
const LOOKUP_ONLY: &str = "embed_tokens_per_layer.weight";
/// Matrices the model keeps dense in f32 whatever the choice (the MoE router: its top-k
/// choice is sensitive to rounding).
const DENSE_MATRICES: [&str; 1] = ["router.proj.weight"];

/// Where the weights live.
enum Backend {
    Safetensors {
        st: candle_core::safetensors::MmapedSafetensors,
        /// `model.language_model.`, `model.` or empty.
        prefix: String,
        /// Where each tensor's bytes are, for quantizing while reading.
        index: isq::Index,
    },
    Gguf {
        content: gguf_file::Content,
        file: Mutex<std::fs::File>,
    },
}

/// An open checkpoint that hands out tensors on a chosen device and dtype.
pub struct WeightStore {
    backend: Backend,
    path: PathBuf,
    device: Device,
    dtype: DType,
    /// How safetensors matrices are held.
    choice: WeightsChoice,
    /// Bytes of every tensor handed out so far (what the model holds once built).
    loaded_bytes: AtomicUsize,
}

/// One tensor as its file header describes it.
struct HeaderTensor {
    /// Logical name (prefix stripped), for safetensors.
    name: String,
    /// Rank of the tensor.
    rank: usize,
    /// The stored dtype, for safetensors.
    stored: Option<DType>,
    elements: u64,
    /// Length of the innermost (row) dimension: quantized blocks run along it.
    cols: usize,
    /// The stored GGUF type (`None` for safetensors, which are always converted).
    ggml: Option<candle_core::quantized::GgmlDType>,
    /// Only ever read by row (the per-layer token table): never repacked for matmuls.
    lookup_only: bool,
}

/// A matrix for `x·Wᵀ` as held: in our kernels' tiles (quantized, on the CPU) or as candle
/// holds it (dense, or on another device).
#[derive(Debug, Clone)]
pub enum Matrix {
    /// candle's matrix: dense, or quantized on a GPU.
    Candle(QMatMul),
    /// Repacked for the CPU kernels of [`crate::qmatmul`].
    Packed(Arc<PackedMatrix>),
}

impl Matrix {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Matrix::Packed(p) => p.held_bytes(),
            Matrix::Candle(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Matrix::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => tensor_bytes(t),
        }
    }

    /// The profiler's row for multiplies by this matrix.
    pub fn profile_label(&self) -> &'static str {
        match self {
            Matrix::Packed(p) => crate::profile::quant_label(ggml_type(p.format())),
            Matrix::Candle(QMatMul::QTensor(q)) => crate::profile::quant_label(q.dtype()),
            Matrix::Candle(QMatMul::Tensor(_)) => "matmul dense",
            Matrix::Candle(QMatMul::TensorF16(_)) => "matmul dense f16",
        }
    }
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore")
            .field("path", &self.path)
            .field(
                "format",
                &if self.is_gguf() {
                    "gguf"
                } else {
                    "safetensors"
                },
            )
            .field("dtype", &self.dtype)
            .field("weights", &self.choice)
            .finish()
    }
}

/// Whether `path` names a GGUF file (by extension, as llama.cpp and LM Studio do).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The folder holding `config.json` for a safetensors checkpoint named by `path` (the folder
/// itself, or the folder of a named shard or index).
pub fn checkpoint_dir(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

impl WeightStore {
    /// Opens any checkpoint: a `.gguf` file, or safetensors (a folder, a `.safetensors` file
    /// or a `model.safetensors.index.json`). The one place that tells the formats apart.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<Self> {
        if is_gguf_path(path) {
            return Self::open_gguf(path, opts);
        }
        // Without its config a safetensors folder is not a model: say that first.
        let config = checkpoint_dir(path).join("config.json");
        std::fs::metadata(&config).map_err(|source| EngineError::Io {
            path: config,
            source,
        })?;
        Self::open_safetensors(path, opts)
    }

    /// The checkpoint's format.
    pub fn format(&self) -> WeightFormat {
        match self.backend {
            Backend::Gguf { .. } => WeightFormat::Gguf,
            Backend::Safetensors { .. } => WeightFormat::Safetensors,
        }
    }

    /// Names, shapes and stored types of the language model's tensors, from the headers
    /// alone (a multimodal checkpoint's vision and audio towers are left out).
    fn header_tensors(&self) -> Vec<HeaderTensor> {
        match &self.backend {
            Backend::Gguf { content, .. } => content
                .tensor_infos
                .iter()
                .map(|(n, t)| HeaderTensor {
                    lookup_only: n == &gguf_name(LOOKUP_ONLY),
                    name: String::new(),
                    rank: t.shape.rank(),
                    stored: None,
                    elements: t.shape.elem_count() as u64,
                    cols: t.shape.dims().last().copied().unwrap_or(0),
                    ggml: Some(t.ggml_dtype),
                })
                .collect(),
            Backend::Safetensors { st, prefix, index } => st
                .tensors()
                .into_iter()
                .filter(|(n, _)| n.starts_with(prefix.as_str()) || n == "lm_head.weight")
                .map(|(n, v)| HeaderTensor {
                    lookup_only: n.strip_prefix(prefix.as_str()) == Some(LOOKUP_ONLY),
                    name: n.strip_prefix(prefix.as_str()).unwrap_or(&n).to_owned(),
                    rank: v.shape().len(),
                    stored: index.dtype(&n),
                    elements: v.shape().iter().product::<usize>() as u64,
                    cols: v.shape().last().copied().unwrap_or(0),
                    ggml: None,
                })
                .collect(),
        }
    }

    /// The decoder layers the checkpoint holds tensors for (`blk.N.` in GGUF, `layers.N.`
    /// under the language model's prefix in safetensors), from the headers alone.
    pub fn layer_indices(&self) -> BTreeSet<usize> {
        let index = |rest: &str| rest.split('.').next().and_then(|n| n.parse().ok());
        match &self.backend {
            Backend::Gguf { content, .. } => content
                .tensor_infos
                .keys()
                .filter_map(|n| n.strip_prefix("blk.").and_then(index))
                .collect(),
            Backend::Safetensors { st, prefix, .. } => {
                let lead = format!("{prefix}layers.");
                st.tensors()
                    .into_iter()
                    .filter_map(|(n, _)| n.strip_prefix(lead.as_str()).and_then(index))
                    .collect()
            }
        }
    }

    /// Parameters in the language model's tensors, counted from the headers.
    pub fn param_count(&self) -> u64 {
        self.header_tensors().iter().map(|t| t.elements).sum()
    }

    /// How a safetensors tensor of the language model is held, from its header alone: the
    /// one rule [`WeightStore::held_bytes_estimate`] and the loader share.
    fn st_held(&self, name: &str, rank: usize, cols: usize, stored: Option<DType>) -> Held {
        if rank < 2 || DENSE_MATRICES.iter().any(|d| name.ends_with(d)) {
            Held::Dense(self.dtype)
        } else if TABLES.contains(&name) {
            self.choice
                .table(cols, stored.unwrap_or(DType::F32), &self.device)
        } else {
            self.choice.matrix(cols, &self.device)
        }
    }

    /// The bytes the weights will take once loaded with this store's options, from the
    /// headers alone: quantized GGUF matrices at their block size (Q5_0 repacked to Q8_0 on
    /// CPU, as [`WeightStore::linear`] does); safetensors matrices and tables as the
    /// [`WeightsChoice`] holds them; vectors dense in the load dtype. Vision and audio towers
    /// are left out (they are never read). Equals [`WeightStore::loaded_bytes`] after a full
    /// load up to the few small vectors the loader keeps in f32 (tested within 5%).
    pub fn held_bytes_estimate(&self) -> u64 {
        let dense = self.dtype.size_in_bytes() as u64;
        self.header_tensors()
            .iter()
            .map(|t| match t.ggml {
                Some(q) if q.block_size() > 1 && t.cols % q.block_size() == 0 => {
                    match self.packed_format(q, t.cols, t.lookup_only) {
                        Some(f) => {
                            packed_bytes(f, (t.elements / t.cols as u64) as usize, t.cols) as u64
                        }
                        None => t.elements / q.block_size() as u64 * q.type_size() as u64,
                    }
                }
                Some(_) => t.elements * dense,
                None => match self.st_held(&t.name, t.rank, t.cols, t.stored) {
                    Held::Quantized(q) => match self.packed_format(q, t.cols, t.lookup_only) {
                        Some(f) => {
                            packed_bytes(f, (t.elements / t.cols as u64) as usize, t.cols) as u64
                        }
                        None => Held::Quantized(q).bytes(t.elements),
                    },
                    held => held.bytes(t.elements),
                },
            })
            .sum()
    }

    /// Opens safetensors weights: a `.safetensors` file, or a directory holding
    /// `model.safetensors` or a sharded `model.safetensors.index.json`.
    pub fn open_safetensors(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let (st, origin, shards) = safetensors::open(path)?;
        let prefix = safetensors::detect_prefix(&st);
        let index = isq::Index::open(&shards)?;
        Ok(Self {
            backend: Backend::Safetensors { st, prefix, index },
            path: origin,
            device: opts.device.clone(),
            dtype: opts.dtype,
            choice: opts.weights,
            loaded_bytes: AtomicUsize::new(0),
        })
    }

    /// Opens safetensors weights whose logical names sit under `prefix` (`model.` for the
    /// vision tower and projector of a multimodal checkpoint, beside its language model).
    pub fn open_safetensors_prefixed(
        path: &Path,
        opts: &LoadOptions,
        prefix: &str,
    ) -> Result<Self> {
        let mut ws = Self::open_safetensors(path, opts)?;
        if let Backend::Safetensors { prefix: p, .. } = &mut ws.backend {
            *p = prefix.to_string();
        }
        Ok(ws)
    }

    /// Opens a GGUF file; returns the store and its parsed header (metadata + tensor
    /// directory), which [`crate::checkpoint::config::gguf::config_from_gguf`] turns into a config.
    pub fn open_gguf(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let io = |source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // Our own check first: candle's reader must never see a header that lies.
        gguf_check::check(&mut file, len).map_err(|reason| EngineError::CorruptFile {
            path: path.to_path_buf(),
            reason,
        })?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        let content =
            gguf_file::Content::read(&mut file).map_err(|e| EngineError::CorruptFile {
                path: path.to_path_buf(),
                reason: format!("cannot parse GGUF header: {e}"),
            })?;
        Ok(Self {
            backend: Backend::Gguf {
                content,
                file: Mutex::new(file),
            },
            path: path.to_path_buf(),
            device: opts.device.clone(),
            dtype: opts.dtype,
            choice: opts.weights,
            loaded_bytes: AtomicUsize::new(0),
        })
    }

    /// Total bytes of the tensors handed out so far: after a model is built from this
    /// store, the size of its weights as held in memory (quantized matrices at their
    /// quantized size).
    pub fn loaded_bytes(&self) -> usize {
        self.loaded_bytes.load(Ordering::Relaxed)
    }

    fn note(&self, bytes: usize) {
        self.loaded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The GGUF header, if this is a GGUF file.
    pub fn gguf_content(&self) -> Option<&gguf_file::Content> {
        match &self.backend {
            Backend::Gguf { content, .. } => Some(content),
            Backend::Safetensors { .. } => None,
        }
    }

    /// True for GGUF files.
    pub fn is_gguf(&self) -> bool {
        matches!(self.backend, Backend::Gguf { .. })
    }

    /// The device tensors are placed on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype dense tensors are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// How safetensors matrices are held (GGUF files keep their own types).
    pub fn weights_choice(&self) -> WeightsChoice {
        self.choice
    }

    /// The file (or directory) the weights come from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name a logical tensor has in the file.
    pub fn file_name(&self, name: &str) -> String {
        match &self.backend {
            Backend::Safetensors { prefix, .. } => {
                if name == "lm_head.weight" {
                    name.to_string()
                } else {
                    format!("{prefix}{name}")
                }
            }
            Backend::Gguf { .. } => gguf_name(name),
        }
    }

    /// Whether the checkpoint has this logical tensor.
    pub fn contains(&self, name: &str) -> bool {
        let n = self.file_name(name);
        match &self.backend {
            Backend::Safetensors { st, .. } => st.get(&n).is_ok(),
            Backend::Gguf { content, .. } => content.tensor_infos.contains_key(&n),
        }
    }

    fn missing(&self, name: &str) -> EngineError {
        EngineError::MissingTensor {
            name: self.file_name(name),
            origin: self.path.display().to_string(),
        }
    }

    fn check_shape(&self, name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
        if actual != expected {
            return Err(EngineError::ShapeMismatch {
                name: self.file_name(name),
                expected: expected.to_vec(),
                actual: actual.to_vec(),
            });
        }
        Ok(())
    }

    fn corrupt(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::CorruptFile {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    /// Reads a GGUF tensor (quantized as stored) after checking its shape.
    fn gguf_qtensor(&self, name: &str, shape: &[usize]) -> Result<QTensor> {
        let Backend::Gguf { content, file } = &self.backend else {
            return Err(EngineError::invalid("not a GGUF store"));
        };
        let n = self.file_name(name);
        let info = content
            .tensor_infos
            .get(&n)
            .ok_or_else(|| self.missing(name))?;
        self.check_shape(name, info.shape.dims(), shape)?;
        let mut f = file
            .lock()
            .map_err(|_| EngineError::invalid("GGUF reader poisoned by an earlier panic"))?;
        let q = info
            .read(&mut *f, content.tensor_data_offset, &self.device)
            .map_err(|e| self.corrupt(format!("tensor `{n}`: {e}")))?;
        // Non-finite weights are refused here, as the file is read: some kernels would turn
        // them into finite noise rather than non-finite logits.
        let data = q.data()?;
        if let Some(block) = gguf_check::first_non_finite(q.dtype(), &data) {
            return Err(self.corrupt(format!(
                "tensor `{n}` holds a non-finite value (NaN or infinity) in block {block}"
            )));
        }
        Ok(q)
    }

    /// The kernel format a quantized tensor of type `q` with rows of `cols` is repacked to
    /// on this store's device: on the CPU, every type our kernels read, except tables only
    /// ever read by row; elsewhere none (GPUs keep candle's kernels).
    fn packed_format(
        &self,
        q: candle_core::quantized::GgmlDType,
        cols: usize,
        lookup_only: bool,
    ) -> Option<QFormat> {
        let f = crate::qmatmul::format_of(q)?;
        (self.device.is_cpu() && !lookup_only && cols.is_multiple_of(f.geometry().sb)).then_some(f)
    }

    /// A quantized tensor as a matrix: repacked into the CPU kernels' tiles where they read
    /// it (the `QTensor` is dropped: one copy of each weight), else kept as candle holds it.
    /// A GGUF file's unquantized matrices (which candle reads as f32) are kept in the compute
    /// dtype; ggml F16/BF16 rows from quantizing safetensors stay in their 16-bit blocks.
    fn hold(&self, q: QTensor) -> Result<Matrix> {
        let (_, cols) = q.shape().dims2()?;
        if self.packed_format(q.dtype(), cols, false).is_some() {
            if let Some(p) = from_qtensor(&q)? {
                return Ok(Matrix::Packed(Arc::new(p)));
            }
        }
        if !self.is_gguf() {
            return Ok(Matrix::Candle(QMatMul::QTensor(Arc::new(q))));
        }
        Ok(match QMatMul::from_qtensor(q)? {
            QMatMul::Tensor(t) => Matrix::Candle(QMatMul::Tensor(t.to_dtype(self.dtype)?)),
            other => Matrix::Candle(other),
        })
    }

    /// Rows `[first, first + rows)` of a safetensors tensor quantized to `held`, read chunk by
    /// chunk from the file (see [`isq`]); `None` when `held` is dense (or the stored type is
    /// one the reader does not convert), for the caller's dense path. `dims` is the result's
    /// shape; for a whole tensor it is checked against the header.
    fn st_quantized(
        &self,
        name: &str,
        dims: &[usize],
        held: Held,
        first: usize,
        rows: usize,
    ) -> Result<Option<QTensor>> {
        let Backend::Safetensors { st, index, .. } = &self.backend else {
            return Ok(None);
        };
        let Held::Quantized(q) = held else {
            return Ok(None);
        };
        let n = self.file_name(name);
        let view = st.get(&n).map_err(|_| self.missing(name))?;
        if first == 0 && dims.len() == view.shape().len() {
            self.check_shape(name, view.shape(), dims)?;
        }
        if index.dtype(&n).is_none() {
            return Ok(None);
        }
        let t = index
            .quantize(&n, first, rows, dims, q, &self.device)
            .map_err(|e| match e {
                EngineError::CorruptFile { .. } => e,
                other => self.corrupt(format!("tensor `{n}`: {other}")),
            })?;
        Ok(Some(t))
    }

    /// A dense tensor in the store's dtype (dequantized if the file stores it quantized).
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.tensor_as(name, shape, self.dtype)
    }

    /// A dense tensor in an explicit dtype (e.g. f32 for router or scale vectors).
    pub fn tensor_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        match &self.backend {
            Backend::Safetensors { st, .. } => {
                let n = self.file_name(name);
                let view = st.get(&n).map_err(|_| self.missing(name))?;
                self.check_shape(name, view.shape(), shape)?;
                let t = st
                    .load(&n, &self.device)
                    .map_err(|e| self.corrupt(format!("tensor `{n}`: {e}")))?;
                let t = t.to_dtype(dtype)?;
                self.note(tensor_bytes(&t));
                Ok(t)
            }
            Backend::Gguf { .. } => {
                let q = self.gguf_qtensor(name, shape)?;
                let t = q.dequantize(&self.device)?.to_dtype(dtype)?;
                self.note(tensor_bytes(&t));
                Ok(t)
            }
        }
    }

    /// A `[out, inp]` matrix for `x·Wᵀ`: quantized matrices stay quantized.
    pub fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Matrix> {
        let m = match &self.backend {
            Backend::Safetensors { .. } => {
                let held = self.st_held(name, 2, inp, None);
                match self.st_quantized(name, &[out, inp], held, 0, out)? {
                    Some(q) => self.hold(q)?,
                    None => {
                        let t = self.tensor_as(name, &[out, inp], dense_dtype(held, self.dtype))?;
                        return Ok(Matrix::Candle(QMatMul::Tensor(t)));
                    }
                }
            }
            Backend::Gguf { .. } => self.hold(self.gguf_qtensor(name, &[out, inp])?)?,
        };
        self.note(m.bytes());
        Ok(m)
    }

    /// A `[rows, cols]` table as a quantized tensor when the file stores it quantized
    /// (token embeddings: row lookups, and with `matmul` the tied output projection, stay
    /// quantized). A table also used as a matrix is held in the CPU kernels' tiles, whose rows
    /// the lookups read as well: one copy serves both.
    pub fn table(&self, name: &str, rows: usize, cols: usize, matmul: bool) -> Result<Table> {
        let quantized = match &self.backend {
            Backend::Safetensors { index, .. } => {
                let stored = index.dtype(&self.file_name(name));
                let held = self.st_held(name, 2, cols, stored);
                match self.st_quantized(name, &[rows, cols], held, 0, rows)? {
                    Some(q) => q,
                    None => {
                        let dtype = dense_dtype(held, self.dtype);
                        return Ok(Table::Dense(self.tensor_as(name, &[rows, cols], dtype)?));
                    }
                }
            }
            Backend::Gguf { .. } => {
                let q = self.gguf_qtensor(name, &[rows, cols])?;
                if q.dtype().block_size() == 1 || !cols.is_multiple_of(q.dtype().block_size()) {
                    let t = q.dequantize(&self.device)?.to_dtype(self.dtype)?;
                    self.note(tensor_bytes(&t));
                    return Ok(Table::Dense(t));
                }
                q
            }
        };
        let table = match self.packed_format(quantized.dtype(), cols, !matmul) {
            Some(_) => match from_qtensor(&quantized)? {
                Some(p) => Table::Packed(Arc::new(p)),
                None => Table::Quantized(Arc::new(quantized)),
            },
            None => Table::Quantized(Arc::new(quantized)),
        };
        self.note(table.bytes());
        Ok(table)
    }

    /// `[n, out, inp]` stacked matrices (MoE experts) as one matrix per expert.
    pub fn stacked_linears(
        &self,
        name: &str,
        n: usize,
        out: usize,
        inp: usize,
    ) -> Result<Vec<Matrix>> {
        let matrices: Vec<Matrix> = match &self.backend {
            Backend::Safetensors { st, .. } => {
                let held = self.st_held(name, 3, inp, None);
                if let Held::Quantized(_) = held {
                    let n_file = self.file_name(name);
                    let view = st.get(&n_file).map_err(|_| self.missing(name))?;
                    self.check_shape(name, view.shape(), &[n, out, inp])?;
                    (0..n)
                        .map(|e| {
                            let q = self
                                .st_quantized(name, &[out, inp], held, e * out, out)?
                                .ok_or_else(|| self.missing(name))?;
                            self.hold(q)
                        })
                        .collect::<Result<_>>()?
                } else {
                    // tensor_as has counted these bytes.
                    let t = self.tensor_as(name, &[n, out, inp], dense_dtype(held, self.dtype))?;
                    return (0..n)
                        .map(|e| Ok(Matrix::Candle(QMatMul::Tensor(t.get(e)?.contiguous()?))))
                        .collect();
                }
            }
            Backend::Gguf { .. } => {
                let q = self.gguf_qtensor(name, &[n, out, inp])?;
                let bytes = q.data()?;
                let per = bytes.len() / n.max(1);
                (0..n)
                    .map(|e| {
                        let part = &bytes[e * per..(e + 1) * per];
                        if let Some(f) = self.packed_format(q.dtype(), inp, false) {
                            let p = PackedMatrix::from_ggml(f, part, out, inp)?;
                            return Ok(Matrix::Packed(Arc::new(p)));
                        }
                        let part = candle_core::quantized::ggml_file::qtensor_from_ggml(
                            q.dtype(),
                            part,
                            vec![out, inp],
                            &self.device,
                        )?;
                        self.hold(part)
                    })
                    .collect::<Result<_>>()?
            }
        };
        self.note(matrices.iter().map(Matrix::bytes).sum());
        Ok(matrices)
    }
}

/// The dtype a dense-held tensor is loaded in (quantized holds that fall back to dense use
/// the compute dtype).
fn dense_dtype(held: Held, compute: DType) -> DType {
    match held {
        Held::Dense(d) => d,
        Held::Quantized(_) => compute,
    }
}

/// A lookup table (token embedding) that may stay quantized.
#[derive(Debug, Clone)]
pub enum Table {
    /// Plain tensor `[rows, cols]`.
    Dense(Tensor),
    /// Quantized `[rows, cols]`; rows are dequantized on lookup.
    Quantized(Arc<QTensor>),
    /// In the CPU kernels' tiles (a table that is also the tied output projection).
    Packed(Arc<PackedMatrix>),
}

impl Table {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Table::Dense(t) => tensor_bytes(t),
            Table::Quantized(q) => q.storage_size_in_bytes(),
            Table::Packed(p) => p.held_bytes(),
        }
    }

    /// Rows for `ids` (u32, any shape) → `[..ids, cols]` in `dtype`.
    pub fn lookup(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        Ok(match self {
            Table::Dense(w) => {
                let mut dims = ids.dims().to_vec();
                dims.push(w.dim(1)?);
                w.index_select(&ids.flatten_all()?, 0)?
                    .reshape(dims)?
                    .to_dtype(dtype)?
            }
            Table::Quantized(q) => q.embedding(ids)?.to_dtype(dtype)?,
            Table::Packed(p) => {
                let flat: Vec<u32> = ids.flatten_all()?.to_vec1()?;
                let mut dims = ids.dims().to_vec();
                dims.push(p.cols());
                Tensor::from_vec(p.embedding(&flat)?, dims, ids.device())?.to_dtype(dtype)?
            }
        })
    }

    /// The table as the matrix of `x·Tᵀ` (tied output projection).
    pub fn as_matrix(&self) -> Matrix {
        match self {
            Table::Dense(w) => Matrix::Candle(QMatMul::Tensor(w.clone())),
            // Not `from_arc`: it would expand f16/bf16 rows to a dense f32 copy of the table.
            Table::Quantized(q) => Matrix::Candle(QMatMul::QTensor(q.clone())),
            Table::Packed(p) => Matrix::Packed(p.clone()),
        }
    }
}
