//! SafeTensors files (<https://github.com/huggingface/safetensors>): the open format of an export's embedding
//! tables and dense parameters, readable without our code (`safetensors`, numpy, PyTorch; docs/serving.md,
//! "Reading an export without pstrain").
//!
//! A file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
//! range (plus string metadata under `__metadata__`), then the tensors' bytes in header order.
//! [`write_file`] streams: the header is built from the shapes alone and each tensor's bytes come from the
//! caller in order, so a table larger than memory is written from a scan of its rows. [`read_file`] checks a
//! file with the format's own crate and hands out each tensor by name, refusing a missing tensor or a wrong
//! dtype or shape by name.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Element types used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// 32-bit float, little-endian.
    F32,
    /// Unsigned 64-bit integer, little-endian (ids).
    U64,
    /// bfloat16, little-endian (the weights of a bf16 table).
    BF16,
    /// IEEE half, little-endian (the weights of an f16 table).
    F16,
}

impl Dtype {
    /// The SafeTensors name (`F32`, `U64`, `BF16`, `F16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::U64 => "U64",
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
        }
    }

    fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::U64 => 8,
            Dtype::BF16 | Dtype::F16 => 2,
        }
    }
}

/// A tensor to write: its name, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name, unique in the file.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major).
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Bytes of its data.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.size() as u64
    }
}

/// Why a SafeTensors file could not be written or read. Messages name the file and, where one is at fault,
/// the tensor.
#[derive(Debug, Error)]
pub enum TensorsError {
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a valid SafeTensors file (truncated, a bad header, overlapping data).
    #[error("{}: not a valid SafeTensors file: {detail}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What the format's reader said.
        detail: String,
    },
    /// A tensor is missing or not what the reader expects.
    #[error("{}: tensor {tensor:?}: {detail}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// The writer's callback gave a tensor another number of bytes than its shape holds.
    #[error("{}: tensor {tensor:?}: {written} bytes written, its shape holds {expected}", path.display())]
    Length {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Bytes written.
        written: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// Two tensors of one name.
    #[error("{}: tensor {tensor:?} given twice", path.display())]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TensorsError + '_ {
    move |source| TensorsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Counts what passes through to the file.
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The header of `specs` and `metadata`: JSON, padded with spaces to a multiple of 8 bytes.
fn header(specs: &[TensorSpec], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        map.insert(
            "__metadata__".into(),
            serde_json::to_value(metadata).expect("strings serialize"),
        );
    }
    let mut at = 0u64;
    for s in specs {
        let end = at + s.bytes();
        map.insert(
            s.name.clone(),
            serde_json::json!({ "dtype": s.dtype.name(), "shape": s.shape, "data_offsets": [at, end] }),
        );
        at = end;
    }
    let mut json = serde_json::to_vec(&map).expect("header serializes");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    json
}

/// Writes `path` atomically (a `.tmp` beside it, fsynced, renamed): the tensors `specs` in order, with
/// `metadata`; `fill(k, out)` writes tensor `k`'s bytes (little-endian, row-major) and must write exactly
/// as many as its shape holds. Returns the file's size.
pub fn write_file(
    path: &Path,
    specs: &[TensorSpec],
    metadata: &BTreeMap<String, String>,
    fill: &mut dyn FnMut(usize, &mut dyn Write) -> Result<(), TensorsError>,
) -> Result<u64, TensorsError> {
    let mut names = std::collections::HashSet::new();
    for s in specs {
        if !names.insert(s.name.as_str()) || s.name == "__metadata__" {
            return Err(TensorsError::Duplicate {
                path: path.to_owned(),
                tensor: s.name.clone(),
            });
        }
    }
    let tmp = path.with_extension("safetensors.tmp");
    let written = write_tmp(&tmp, specs, metadata, fill, path);
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let size = written?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(size)
}

/// [`write_file`]'s body, into `tmp`, fsynced.
fn write_tmp(
    tmp: &Path,
    specs: &[TensorSpec],
    metadata: &BTreeMap<String, String>,
    fill: &mut dyn FnMut(usize, &mut dyn Write) -> Result<(), TensorsError>,
    path: &Path,
) -> Result<u64, TensorsError> {
    let file = std::fs::File::create(tmp).map_err(io(tmp))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let head = header(specs, metadata);
    out.write_all(&(head.len() as u64).to_le_bytes())
        .and_then(|()| out.write_all(&head))
        .map_err(io(tmp))?;
    let mut size = 8 + head.len() as u64;
    for (k, s) in specs.iter().enumerate() {
        let mut counting = Counting {
            inner: &mut out,
            written: 0,
        };
        fill(k, &mut counting)?;
        if counting.written != s.bytes() {
            return Err(TensorsError::Length {
                path: path.to_owned(),
                tensor: s.name.clone(),
                written: counting.written,
                expected: s.bytes(),
            });
        }
        size += s.bytes();
    }
    let file = out.into_inner().map_err(|e| io(tmp)(e.into_error()))?;
    file.sync_all().map_err(io(tmp))?;
    Ok(size)
}

/// One tensor read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The dtype in the file (BF16 and F16 elements are held widened to f32, exactly).
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Elements, as their dtype asks.
    pub data: TensorData,
}

/// A tensor's elements.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// F32 elements (also BF16 and F16 ones, widened exactly).
    F32(Vec<f32>),
    /// U64 elements.
    U64(Vec<u64>),
}

/// A file read and checked: its tensors by name and its metadata.
#[derive(Debug)]
pub struct TensorFile {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
    metadata: HashMap<String, String>,
}

/// Reads and checks `path` with the `safetensors` crate (header, offsets, sizes); tensors of other dtypes
/// than F32, BF16, F16 and U64 are refused naming them.
pub fn read_file(path: &Path) -> Result<TensorFile, TensorsError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let format = |e: safetensors::SafeTensorError| TensorsError::Format {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    let parsed = safetensors::SafeTensors::deserialize(&bytes).map_err(format)?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(format)?;
    let mut tensors = HashMap::new();
    for (name, view) in parsed.tensors() {
        let halves = |widen: fn(u16) -> f32| {
            let it = view.data().chunks_exact(2);
            TensorData::F32(
                it.map(|c| widen(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            )
        };
        let (dtype, data) = match view.dtype() {
            safetensors::Dtype::F32 => (
                Dtype::F32,
                TensorData::F32(
                    view.data()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
            ),
            safetensors::Dtype::BF16 => {
                (Dtype::BF16, halves(|b| half::bf16::from_bits(b).to_f32()))
            }
            safetensors::Dtype::F16 => (Dtype::F16, halves(|b| half::f16::from_bits(b).to_f32())),
            safetensors::Dtype::U64 => (
                Dtype::U64,
                TensorData::U64(
                    view.data()
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                ),
            ),
            other => {
                return Err(TensorsError::Tensor {
                    path: path.to_owned(),
                    tensor: name,
                    detail: format!("dtype {other:?}, expected F32, BF16, F16 or U64"),
                })
            }
        };
        let shape = view.shape().to_vec();
        tensors.insert(name, Tensor { dtype, shape, data });
    }
    Ok(TensorFile {
        path: path.to_owned(),
        tensors,
        metadata: meta.metadata().clone().unwrap_or_default(),
    })
}

impl TensorFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `__metadata__` strings.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The tensor names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    fn error(&self, tensor: &str, detail: String) -> TensorsError {
        TensorsError::Tensor {
            path: self.path.clone(),
            tensor: tensor.to_owned(),
            detail,
        }
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<&TensorData, TensorsError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| self.error(name, "missing".into()))?;
        if t.shape != shape {
            return Err(self.error(name, format!("shape {:?}, expected {shape:?}", t.shape)));
        }
        Ok(&t.data)
    }

    /// Tensor `name`'s float elements (F32, or BF16 and F16 widened exactly); refused naming it when missing,
    /// of another dtype or another shape.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<&[f32], TensorsError> {
        match self.get(name, shape)? {
            TensorData::F32(v) => Ok(v),
            TensorData::U64(_) => Err(self.error(name, "dtype U64, expected F32".into())),
        }
    }

    /// Tensor `name`'s U64 elements; refused naming it when missing, of another dtype or another shape.
    pub fn u64(&self, name: &str, shape: &[usize]) -> Result<&[u64], TensorsError> {
        match self.get(name, shape)? {
            TensorData::U64(v) => Ok(v),
            TensorData::F32(_) => Err(self.error(name, "dtype F32, expected U64".into())),
        }
    }

    /// Tensor `name`'s dtype in the file, refused naming it when missing.
    pub fn dtype(&self, name: &str) -> Result<Dtype, TensorsError> {
        self.tensors
            .get(name)
            .map(|t| t.dtype)
            .ok_or_else(|| self.error(name, "missing".into()))
    }

    /// Tensor `name`'s shape, refused naming it when missing.
    pub fn shape(&self, name: &str) -> Result<&[usize], TensorsError> {
        self.tensors
            .get(name)
            .map(|t| t.shape.as_slice())
            .ok_or_else(|| self.error(name, "missing".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> PathBuf {
        let path = dir.join("a.safetensors");
        let specs = vec![
            TensorSpec {
                name: "t.ids".into(),
                dtype: Dtype::U64,
                shape: vec![3],
            },
            TensorSpec {
                name: "t.weight".into(),
                dtype: Dtype::F32,
                shape: vec![3, 2],
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "test".to_string())]);
        write_file(&path, &specs, &meta, &mut |k, out| {
            match k {
                0 => [5u64, 9, 11]
                    .iter()
                    .try_for_each(|v| out.write_all(&v.to_le_bytes())),
                _ => (0..6).try_for_each(|i| out.write_all(&(i as f32 * 0.5).to_le_bytes())),
            }
            .map_err(io(Path::new("mem")))
        })
        .unwrap();
        path
    }

    #[test]
    fn round_trip_with_the_crate() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample(dir.path());
        let f = read_file(&path).unwrap();
        assert_eq!(f.u64("t.ids", &[3]).unwrap(), &[5, 9, 11]);
        assert_eq!(
            f.f32("t.weight", &[3, 2]).unwrap(),
            &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
        );
        assert_eq!(f.metadata()["format"], "test");
        // Named refusals.
        let e = f.f32("t.ids", &[3]).unwrap_err().to_string();
        assert!(e.contains("\"t.ids\"") && e.contains("dtype U64"), "{e}");
        let e = f.f32("t.weight", &[2, 3]).unwrap_err().to_string();
        assert!(
            e.contains("\"t.weight\"") && e.contains("shape [3, 2]"),
            "{e}"
        );
        let e = f.u64("u.ids", &[3]).unwrap_err().to_string();
        assert!(e.contains("\"u.ids\"") && e.contains("missing"), "{e}");
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        assert!(e.contains("not a valid SafeTensors file"), "{e}");
        std::fs::write(&path, b"PK\x03\x04 a zip file").unwrap();
        assert!(matches!(read_file(&path), Err(TensorsError::Format { .. })));
    }

    #[test]
    fn a_short_tensor_is_refused_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.safetensors");
        let specs = vec![TensorSpec {
            name: "w".into(),
            dtype: Dtype::F32,
            shape: vec![4],
        }];
        let e = write_file(&path, &specs, &BTreeMap::new(), &mut |_, out| {
            out.write_all(&[0u8; 12]).map_err(io(Path::new("mem")))
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                TensorsError::Length {
                    written: 12,
                    expected: 16,
                    ..
                }
            ),
            "{e}"
        );
        assert!(!path.exists());
    }
}
