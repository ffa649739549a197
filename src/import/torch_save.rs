//! A reader of `torch.save` files (the zip archive PyTorch writes since 1.6) that a hostile file
//! cannot make allocate more than the file's own size, nor read past what it holds.
//!
//! burn-store's `PytorchReader` is not used for this: its pickle reader deep-copies memoised
//! objects (a few hundred bytes of pickle that fetch a memo twice per level ask for 2^30 copies),
//! allocates a string's or a zip entry's length as the header states it, and pads a storage that
//! is cut short, or missing, with zeros. Here a pickle value is shared, not copied; every length
//! is checked against the bytes that are there before anything is allocated; and a tensor is read
//! only from a stored zip entry of exactly its storage's size, whose CRC-32 the zip reader checks.
//!
//! What it reads: the archive's `<name>/data.pkl`, a pickle of a dict of tensors (a
//! `state_dict`; nested dicts give dotted names, anything else in them is ignored) built by
//! `torch._utils._rebuild_tensor_v2` over persistent storages `<name>/data/<key>`. Nothing in the
//! pickle is executed: globals are only names, and only the few that make tensors and dicts mean
//! anything.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;
use std::rc::Rc;

use burn::tensor::{DType, TensorData};
use zip::{CompressionMethod, ZipArchive};

/// The largest `data.pkl` read: a `state_dict`'s pickle is about 100 bytes per tensor (ResNet-152's
/// ~900 tensors take ~100 KB), and the pickle's values take a few times its size in memory.
pub const MAX_PICKLE_BYTES: u64 = 4 << 20;
/// How deep dicts nest, and how many entries are visited, while naming tensors: a pickle can
/// share one dict many times over, or put a dict inside itself.
const MAX_DEPTH: usize = 8;
const MAX_ENTRIES: usize = 1 << 16;
const MAX_DIMS: usize = 8;

/// The element type of a storage, by its PyTorch class name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    F32,
    F64,
    F16,
    BF16,
    /// An integer, boolean or complex storage: its PyTorch class name and element size.
    Other(&'static str, usize),
}

impl Element {
    fn of_class(name: &str) -> Option<Element> {
        Some(match name {
            "FloatStorage" => Element::F32,
            "DoubleStorage" => Element::F64,
            "HalfStorage" => Element::F16,
            "BFloat16Storage" => Element::BF16,
            "LongStorage" => Element::Other("LongStorage (int64)", 8),
            "IntStorage" => Element::Other("IntStorage (int32)", 4),
            "ShortStorage" => Element::Other("ShortStorage (int16)", 2),
            "CharStorage" => Element::Other("CharStorage (int8)", 1),
            "ByteStorage" => Element::Other("ByteStorage (uint8)", 1),
            "BoolStorage" => Element::Other("BoolStorage (bool)", 1),
            "ComplexFloatStorage" => Element::Other("ComplexFloatStorage (complex64)", 8),
            "ComplexDoubleStorage" => Element::Other("ComplexDoubleStorage (complex128)", 16),
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::F64 => 8,
            Element::F16 | Element::BF16 => 2,
            Element::Other(_, size) => size,
        }
    }

    /// burn's type for a floating-point element; `None` for the others.
    pub fn float_dtype(self) -> Option<DType> {
        match self {
            Element::F32 => Some(DType::F32),
            Element::F64 => Some(DType::F64),
            Element::F16 => Some(DType::F16),
            Element::BF16 => Some(DType::BF16),
            Element::Other(..) => None,
        }
    }
}

/// One tensor as the pickle describes it: a strided view of a storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub element: Element,
    pub shape: Vec<usize>,
    stride: Vec<usize>,
    offset: usize,
    /// The storage's key: its data is the archive's entry `<name>/data/<key>`.
    storage: String,
    storage_len: usize,
}

/// An opened `torch.save` archive: its tensors by (dotted) name, read on demand.
pub struct TorchSave<R> {
    zip: ZipArchive<R>,
    prefix: String,
    file_len: u64,
    pub tensors: BTreeMap<String, TensorRef>,
}

impl TorchSave<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| e.to_string())?;
        Self::new(BufReader::new(file))
    }
}

impl<R: Read + Seek> TorchSave<R> {
    /// Reads the archive's directory and its pickle, and checks every tensor against the storage
    /// entry it names; no tensor data is read.
    pub fn new(mut reader: R) -> Result<Self, String> {
        let len = reader
            .seek(std::io::SeekFrom::End(0))
            .map_err(|e| e.to_string())?;
        reader.rewind().map_err(|e| e.to_string())?;
        let mut zip = ZipArchive::new(reader)
            .map_err(|e| format!("not a zip archive as torch.save (PyTorch 1.6 or later) writes: {e}"))?;
        let prefix = archive_name(&zip)?;
        let pickle = read_entry(&mut zip, &format!("{prefix}/data.pkl"), len, MAX_PICKLE_BYTES)?;
        if let Some(order) = zip.index_for_name(&format!("{prefix}/byteorder")) {
            let order = zip.by_index(order).map_err(|e| e.to_string())?.size();
            let order = read_entry(&mut zip, &format!("{prefix}/byteorder"), len, order.min(16))?;
            if order != b"little" {
                return Err(format!(
                    "its byteorder is {:?}; ember reads little-endian files only",
                    String::from_utf8_lossy(&order)
                ));
            }
        }
        let root = unpickle(&pickle).map_err(|e| format!("{prefix}/data.pkl: {e}"))?;
        let mut tensors = BTreeMap::new();
        let mut visited = 0;
        name_tensors(&root, "", 0, &mut visited, &mut tensors)
            .map_err(|e| format!("{prefix}/data.pkl: {e}"))?;
        let mut archive = TorchSave {
            zip,
            prefix,
            file_len: len,
            tensors,
        };
        archive.check_storages()?;
        Ok(archive)
    }

    /// Each storage is a stored entry of exactly its length in bytes that lies inside the file
    /// (each tensor lies inside its storage: `tensor_ref` checked that).
    fn check_storages(&mut self) -> Result<(), String> {
        let file_len = self.file_len;
        let mut sizes: HashMap<&str, (Element, usize)> = HashMap::new();
        for (name, t) in &self.tensors {
            let described = sizes.get(t.storage.as_str());
            if described.is_some_and(|&(element, len)| element != t.element || len != t.storage_len) {
                return Err(format!(
                    "{name}: storage {} is described twice, differently",
                    t.storage
                ));
            }
            sizes.insert(&t.storage, (t.element, t.storage_len));
        }
        for (key, (element, len)) in sizes {
            let entry = format!("{}/data/{key}", self.prefix);
            let bytes = len as u64 * element.size() as u64;
            let file = self
                .zip
                .by_name(&entry)
                .map_err(|_| format!("storage {key} is missing (no entry {entry})"))?;
            check_stored(&file, file_len)?;
            if file.size() != bytes {
                return Err(format!(
                    "{entry} holds {} bytes, its storage {bytes} (a truncated or altered file?)",
                    file.size()
                ));
            }
        }
        Ok(())
    }

    /// The tensor's values, contiguous, as f32. This allocates the view's element count (a
    /// storage of one element can be viewed with stride 0 as any shape): check the shape first.
    pub fn read(&mut self, t: &TensorRef) -> Result<TensorData, String> {
        let Some(dtype) = t.element.float_dtype() else {
            return Err(format!("holds {}, floating point expected", t.element_name()));
        };
        let bytes = self.view_bytes(t)?;
        Ok(TensorData::from_bytes_vec(bytes, t.shape.clone(), dtype).convert::<f32>())
    }

    /// The values of an `int64` tensor (a batch norm's `num_batches_tracked`), contiguous, with
    /// the same checks as [`TorchSave::read`].
    pub fn read_i64(&mut self, t: &TensorRef) -> Result<Vec<i64>, String> {
        if t.element != Element::Other("LongStorage (int64)", 8) {
            return Err(format!("holds {}, int64 expected", t.element_name()));
        }
        let bytes = self.view_bytes(t)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect())
    }

    /// The view's bytes, contiguous, in the storage's (little-endian) element layout.
    fn view_bytes(&mut self, t: &TensorRef) -> Result<Vec<u8>, String> {
        let entry = format!("{}/data/{}", self.prefix, t.storage);
        let size = (t.storage_len * t.element.size()) as u64;
        let storage = read_entry(&mut self.zip, &entry, self.file_len, size)?;
        let esize = t.element.size();
        let numel: usize = t.shape.iter().product();
        let contiguous = t
            .shape
            .iter()
            .zip(&t.stride)
            .rev()
            .try_fold(1usize, |expected, (&n, &s)| {
                (n <= 1 || s == expected).then(|| expected * n)
            })
            .is_some();
        let bytes = if numel == 0 {
            Vec::new()
        } else if contiguous {
            storage[t.offset * esize..(t.offset + numel) * esize].to_vec()
        } else {
            let mut bytes = Vec::with_capacity(numel * esize);
            // Row-major walk over the view: `index` counts in the shape, `at` is the element.
            let mut index = vec![0usize; t.shape.len()];
            for _ in 0..numel {
                let at = t.offset + index.iter().zip(&t.stride).map(|(i, s)| i * s).sum::<usize>();
                bytes.extend_from_slice(&storage[at * esize..(at + 1) * esize]);
                for d in (0..index.len()).rev() {
                    index[d] += 1;
                    if index[d] < t.shape[d] {
                        break;
                    }
                    index[d] = 0;
                }
            }
            bytes
        };
        Ok(bytes)
    }
}

impl TensorRef {
    pub fn element_name(&self) -> &'static str {
        match self.element {
            Element::F32 => "FloatStorage (float32)",
            Element::F64 => "DoubleStorage (float64)",
            Element::F16 => "HalfStorage (float16)",
            Element::BF16 => "BFloat16Storage (bfloat16)",
            Element::Other(name, _) => name,
        }
    }
}

/// The one top-level folder that holds `data.pkl`.
fn archive_name<R: Read + Seek>(zip: &ZipArchive<R>) -> Result<String, String> {
    let mut names = zip
        .file_names()
        .filter_map(|n| n.strip_suffix("/data.pkl"))
        .filter(|n| !n.is_empty() && !n.contains('/'));
    match (names.next(), names.next()) {
        (Some(name), None) => Ok(name.to_string()),
        (None, _) => Err("the archive has no <name>/data.pkl: not a torch.save file".into()),
        (Some(a), Some(b)) => Err(format!(
            "the archive holds two pickles, {a}/data.pkl and {b}/data.pkl"
        )),
    }
}

fn check_stored<R: Read>(file: &zip::read::ZipFile<'_, R>, file_len: u64) -> Result<(), String> {
    if file.compression() != CompressionMethod::Stored || file.compressed_size() != file.size() {
        return Err(format!(
            "{} is compressed ({}); torch.save stores entries uncompressed",
            file.name(),
            file.compression()
        ));
    }
    let start = file
        .data_start()
        .ok_or_else(|| format!("{}: no data offset", file.name()))?;
    if start.checked_add(file.size()).is_none_or(|end| end > file_len) {
        return Err(format!(
            "{} claims {} bytes at offset {start}, past the end of the file ({file_len} bytes)",
            file.name(),
            file.size()
        ));
    }
    Ok(())
}

/// The entry `name`, at most `max` bytes, checked stored, inside the file, and against its CRC-32.
fn read_entry<R: Read + Seek>(
    zip: &mut ZipArchive<R>,
    name: &str,
    file_len: u64,
    max: u64,
) -> Result<Vec<u8>, String> {
    let mut file = zip
        .by_name(name)
        .map_err(|_| format!("the archive has no {name}"))?;
    check_stored(&file, file_len)?;
    if file.size() > max {
        return Err(format!(
            "{name} is {} bytes, more than the {max} ember reads",
            file.size()
        ));
    }
    let mut bytes = Vec::with_capacity(file.size() as usize);
    // To the end, not `read_exact`: the zip reader checks the CRC-32 when it reaches the end.
    file.by_ref()
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{name}: {e}"))?;
    if bytes.len() as u64 != file.size() {
        return Err(format!(
            "{name} holds {} bytes, its header says {} (a truncated file?)",
            bytes.len(),
            file.size()
        ));
    }
    Ok(bytes)
}

/// A pickle value. Containers are shared, as in Python: fetching a memoised value or `DUP`
/// copies a pointer, so a pickle's values take memory in proportion to its length.
#[derive(Clone, Debug)]
enum Value {
    None,
    Bool,
    Int(i64),
    Float,
    Str(Rc<str>),
    Bytes,
    Tuple(Rc<[Value]>),
    List(Rc<RefCell<Vec<Value>>>),
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    /// `module.name`, never imported.
    Global(Rc<str>),
    /// A persistent id resolved to a storage: its element type, key and length in elements.
    Storage(Element, Rc<str>, usize),
    Tensor(Rc<TensorRef>),
    /// Anything else an unknown callable would have made.
    Object,
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool => "a bool",
            Value::Int(_) => "an int",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global(_) => "a global",
            Value::Storage(..) => "a storage",
            Value::Tensor(_) => "a tensor",
            Value::Object => "an object",
        }
    }
}

/// Runs the pickle `bytes` (protocols 2 to 5, the binary opcodes) and returns its value.
fn unpickle(bytes: &[u8]) -> Result<Value, String> {
    let mut at = 0usize;
    let mut stack: Vec<Value> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: HashMap<u32, Value> = HashMap::new();
    // Each argument is taken from the bytes that are there: a length is never trusted before
    // the bytes it counts are.
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = at
            .checked_add(n)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| format!("cut short: {n} bytes wanted at byte {at}"))?;
        let s = &bytes[*at..end];
        *at = end;
        Ok(s)
    };
    let uint = |at: &mut usize, n: usize| -> Result<u64, String> {
        let mut v = 0u64;
        for (i, b) in take(at, n)?.iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        Ok(v)
    };
    let len = |at: &mut usize, n: usize| -> Result<usize, String> {
        usize::try_from(uint(at, n)?).map_err(|_| "a length beyond memory".to_string())
    };
    fn pop(stack: &mut Vec<Value>, op: usize) -> Result<Value, String> {
        stack.pop().ok_or_else(|| format!("stack empty at byte {op}"))
    }
    fn pop_mark(stack: &mut Vec<Value>, marks: &mut Vec<usize>, op: usize) -> Result<Vec<Value>, String> {
        let mark = marks.pop().ok_or_else(|| format!("no mark at byte {op}"))?;
        if mark > stack.len() {
            return Err(format!("mark past the stack at byte {op}"));
        }
        Ok(stack.split_off(mark))
    }
    let string = |b: &[u8]| -> Value { Value::Str(String::from_utf8_lossy(b).into()) };
    loop {
        let op = at;
        let code = *take(&mut at, 1)?.first().unwrap_or(&0);
        match code {
            0x80 => drop(take(&mut at, 1)?),    // PROTO
            0x95 => drop(take(&mut at, 8)?),    // FRAME: a hint only
            b'.' => return pop(&mut stack, op), // STOP
            b'(' => marks.push(stack.len()),    // MARK
            b')' => stack.push(Value::Tuple(Rc::new([]))),
            b']' => stack.push(Value::List(Default::default())),
            b'}' => stack.push(Value::Dict(Default::default())),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool),
            0x89 => stack.push(Value::Bool),
            b'K' => stack.push(Value::Int(uint(&mut at, 1)? as i64)),
            b'M' => stack.push(Value::Int(uint(&mut at, 2)? as i64)),
            b'J' => stack.push(Value::Int(uint(&mut at, 4)? as u32 as i32 as i64)),
            0x8a => {
                // LONG1: a little-endian two's-complement integer of n bytes
                let n = len(&mut at, 1)?;
                let b = take(&mut at, n)?;
                if n > 8 {
                    return Err(format!("an integer of {n} bytes at byte {op}"));
                }
                let mut v = 0i64;
                for (i, &x) in b.iter().enumerate() {
                    v |= i64::from(x) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v |= -1i64 << (8 * n);
                }
                stack.push(Value::Int(v));
            }
            b'G' => {
                take(&mut at, 8)?;
                stack.push(Value::Float);
            }
            b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING
                let width = match code {
                    0x8c | b'U' => 1,
                    0x8d => 8,
                    _ => 4,
                };
                let n = len(&mut at, width)?;
                stack.push(string(take(&mut at, n)?));
            }
            b'B' | b'C' | 0x8e => {
                // BINBYTES, SHORT_BINBYTES, BINBYTES8
                let width = match code {
                    b'C' => 1,
                    0x8e => 8,
                    _ => 4,
                };
                let n = len(&mut at, width)?;
                take(&mut at, n)?;
                stack.push(Value::Bytes);
            }
            b'c' => {
                // GLOBAL: "module\nname\n"
                let mut line = || -> Result<&str, String> {
                    let rest = &bytes[at..];
                    let n = rest
                        .iter()
                        .position(|&b| b == b'\n')
                        .ok_or("GLOBAL without a newline")?;
                    at += n + 1;
                    std::str::from_utf8(&rest[..n]).map_err(|_| "GLOBAL not UTF-8".to_string())
                };
                let module = line()?;
                let name = line()?;
                stack.push(Value::Global(format!("{module}.{name}").into()));
            }
            0x93 => {
                // STACK_GLOBAL
                let name = pop(&mut stack, op)?;
                let module = pop(&mut stack, op)?;
                let (Value::Str(module), Value::Str(name)) = (module, name) else {
                    return Err(format!("STACK_GLOBAL of non-strings at byte {op}"));
                };
                stack.push(Value::Global(format!("{module}.{name}").into()));
            }
            b't' => {
                let items = pop_mark(&mut stack, &mut marks, op)?;
                stack.push(Value::Tuple(items.into()));
            }
            0x85..=0x87 => {
                let n = (code - 0x84) as usize;
                if stack.len() < n {
                    return Err(format!("stack empty at byte {op}"));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Value::Tuple(items.into()));
            }
            b'l' => {
                let items = pop_mark(&mut stack, &mut marks, op)?;
                stack.push(Value::List(Rc::new(RefCell::new(items))));
            }
            b'd' => {
                let items = pop_mark(&mut stack, &mut marks, op)?;
                let dict = Value::Dict(Default::default());
                set_items(&dict, items, op)?;
                stack.push(dict);
            }
            b'a' | b'e' => {
                let items = if code == b'a' {
                    vec![pop(&mut stack, op)?]
                } else {
                    pop_mark(&mut stack, &mut marks, op)?
                };
                match stack.last() {
                    Some(Value::List(list)) => list.borrow_mut().extend(items),
                    Some(Value::Object) => {}
                    other => {
                        return Err(format!(
                            "APPEND to {} at byte {op}",
                            other.map_or("nothing", Value::kind)
                        ))
                    }
                }
            }
            b's' | b'u' => {
                let items = if code == b's' {
                    let v = pop(&mut stack, op)?;
                    let k = pop(&mut stack, op)?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack, &mut marks, op)?
                };
                let target = stack.last().ok_or_else(|| format!("stack empty at byte {op}"))?;
                set_items(target, items, op)?;
            }
            b'q' | b'r' | 0x94 => {
                let key = match code {
                    b'q' => uint(&mut at, 1)? as u32,
                    b'r' => uint(&mut at, 4)? as u32,
                    _ => memo.len() as u32,
                };
                let top = stack.last().ok_or_else(|| format!("stack empty at byte {op}"))?;
                memo.insert(key, top.clone());
            }
            b'h' | b'j' => {
                let key = uint(&mut at, if code == b'h' { 1 } else { 4 })? as u32;
                let v = memo
                    .get(&key)
                    .ok_or_else(|| format!("memo {key} unset at byte {op}"))?;
                stack.push(v.clone());
            }
            b'Q' => {
                let pid = pop(&mut stack, op)?;
                stack.push(storage(&pid).map_err(|e| format!("{e} at byte {op}"))?);
            }
            b'R' => {
                let args = pop(&mut stack, op)?;
                let callable = pop(&mut stack, op)?;
                stack.push(reduce(&callable, &args).map_err(|e| format!("{e} at byte {op}"))?);
            }
            0x81 => {
                // NEWOBJ: cls, args
                pop(&mut stack, op)?;
                pop(&mut stack, op)?;
                stack.push(Value::Object);
            }
            b'b' => {
                // BUILD: the state is set on the object below it; for a dict (an OrderedDict's
                // `_metadata`) and unknown objects there is nothing to keep.
                pop(&mut stack, op)?;
                if stack.is_empty() {
                    return Err(format!("stack empty at byte {op}"));
                }
            }
            b'0' => drop(pop(&mut stack, op)?),
            b'1' => drop(pop_mark(&mut stack, &mut marks, op)?),
            b'2' => {
                let top = stack.last().ok_or_else(|| format!("stack empty at byte {op}"))?;
                stack.push(top.clone());
            }
            other => {
                return Err(format!(
                    "pickle opcode {other:#04x} at byte {op} is not one torch.save writes"
                ));
            }
        }
    }
}

fn set_items(target: &Value, items: Vec<Value>, op: usize) -> Result<(), String> {
    if items.len() % 2 != 0 {
        return Err(format!("odd number of items for a dict at byte {op}"));
    }
    match target {
        Value::Dict(dict) => {
            let mut dict = dict.borrow_mut();
            let mut items = items.into_iter();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                dict.push((k, v));
            }
            Ok(())
        }
        Value::Object => Ok(()),
        other => Err(format!("SETITEM on {} at byte {op}", other.kind())),
    }
}

/// A persistent id `('storage', <class>, key, location, length)`.
fn storage(pid: &Value) -> Result<Value, String> {
    let Value::Tuple(t) = pid else {
        return Err(format!("a persistent id that is {}", pid.kind()));
    };
    let (Some(Value::Str(tag)), Some(class), Some(Value::Str(key)), Some(Value::Int(len))) =
        (t.first(), t.get(1), t.get(2), t.get(4))
    else {
        return Err("a persistent id that is not ('storage', class, key, location, length)".into());
    };
    let class = match class {
        Value::Global(g) => g.rsplit('.').next().unwrap_or(g).to_string(),
        Value::Str(s) => s.to_string(),
        other => return Err(format!("a storage class that is {}", other.kind())),
    };
    if &**tag != "storage" {
        return Err(format!("a persistent id tagged {tag:?}"));
    }
    let element = Element::of_class(&class).ok_or_else(|| format!("unknown storage type {class}"))?;
    let len = usize::try_from(*len).map_err(|_| format!("storage {key} of {len} elements"))?;
    if len.checked_mul(element.size()).is_none() {
        return Err(format!("storage {key} of {len} elements"));
    }
    if key.is_empty() || key.contains(['/', '\\']) || &**key == ".." {
        return Err(format!("storage key {key:?}"));
    }
    Ok(Value::Storage(element, key.clone(), len))
}

fn reduce(callable: &Value, args: &Value) -> Result<Value, String> {
    let Value::Global(name) = callable else {
        return Ok(Value::Object);
    };
    let Value::Tuple(args) = args else {
        return Err(format!("{name} called with {}", args.kind()));
    };
    Ok(match &**name {
        "torch._utils._rebuild_tensor_v2" | "torch._utils._rebuild_tensor" => {
            Value::Tensor(Rc::new(tensor_ref(args).map_err(|e| format!("{name}: {e}"))?))
        }
        "torch._utils._rebuild_parameter" | "torch._utils._rebuild_parameter_with_state" => {
            match args.first() {
                Some(t @ Value::Tensor(_)) => t.clone(),
                _ => return Err(format!("{name} of something other than a tensor")),
            }
        }
        "collections.OrderedDict" if args.is_empty() => Value::Dict(Default::default()),
        _ => Value::Object,
    })
}

/// `_rebuild_tensor_v2(storage, offset, shape, stride, ...)`, checked so that no product or sum
/// over the view overflows.
fn tensor_ref(args: &[Value]) -> Result<TensorRef, String> {
    let (Some(Value::Storage(element, key, len)), Some(Value::Int(offset)), Some(shape), Some(stride)) =
        (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        return Err("arguments are not (storage, offset, shape, stride)".into());
    };
    let dims = |v: &Value, what: &str| -> Result<Vec<usize>, String> {
        match v {
            Value::Tuple(t) if t.len() <= MAX_DIMS => t
                .iter()
                .map(|d| match d {
                    Value::Int(i) => usize::try_from(*i).map_err(|_| format!("{what} {i}")),
                    other => Err(format!("{what} is {}", other.kind())),
                })
                .collect(),
            _ => Err(format!("{what} is not a tuple of at most {MAX_DIMS} ints")),
        }
    };
    let shape = dims(shape, "shape")?;
    let stride = dims(stride, "stride")?;
    if shape.len() != stride.len() {
        return Err(format!("shape {shape:?} with stride {stride:?}"));
    }
    let offset = usize::try_from(*offset).map_err(|_| format!("offset {offset}"))?;
    // Every index of the view, and the element count, below the storage's length (itself
    // bounded by the file in `check_storages`) or an error.
    let mut numel = 1usize;
    let mut last = offset;
    for (&n, &s) in shape.iter().zip(&stride) {
        numel = numel.checked_mul(n).ok_or("its element count overflows")?;
        if n > 0 {
            last = (n - 1)
                .checked_mul(s)
                .and_then(|x| x.checked_add(last))
                .ok_or("its extent overflows")?;
        }
    }
    if numel > 0 && last >= *len {
        return Err(format!(
            "it reaches element {last} of storage {key}, which holds {len}"
        ));
    }
    Ok(TensorRef {
        element: *element,
        shape,
        stride,
        offset,
        storage: key.to_string(),
        storage_len: *len,
    })
}

/// The tensors in `value`, a dict, by dotted name (Python's later value for a repeated key).
fn name_tensors(
    value: &Value,
    prefix: &str,
    depth: usize,
    visited: &mut usize,
    out: &mut BTreeMap<String, TensorRef>,
) -> Result<(), String> {
    let Value::Dict(dict) = value else {
        return Err(format!(
            "holds {}, not a dict of tensors (a state_dict)",
            value.kind()
        ));
    };
    if depth >= MAX_DEPTH {
        return Err(format!("dicts nested more than {MAX_DEPTH} deep"));
    }
    for (k, v) in dict.borrow().iter() {
        *visited += 1;
        if *visited > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries in its dicts"));
        }
        let key = match k {
            Value::Str(s) => s.to_string(),
            Value::Int(i) => i.to_string(),
            _ => continue,
        };
        let name = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match v {
            Value::Tensor(t) => {
                out.insert(name, (**t).clone());
            }
            Value::Dict(_) => name_tensors(v, &name, depth + 1, visited, out)?,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protocol-2 pickle opcodes for the tests' hand-made pickles.
    fn unicode(s: &str) -> Vec<u8> {
        let mut v = vec![b'X'];
        v.extend_from_slice(&(s.len() as u32).to_le_bytes());
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn memo_fetches_share_instead_of_copying() {
        // A list that holds itself twice, 40 times over: 2^40 elements if each fetch copied.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for _ in 0..40 {
            p.extend_from_slice(&[b'(', b'h', 0, b'h', 0, b'l', b'q', 0]);
        }
        p.extend_from_slice(&[b'0', b'}', b'.']);
        assert!(matches!(unpickle(&p), Ok(Value::Dict(_))));
    }

    #[test]
    fn a_dict_inside_itself_is_an_error_not_a_recursion() {
        // d = {}; d["a"] = d
        let mut p = vec![0x80, 2, b'}', b'q', 0];
        p.extend(unicode("a"));
        p.extend_from_slice(&[b'h', 0, b's', b'.']);
        let root = unpickle(&p).unwrap();
        let err = name_tensors(&root, "", 0, &mut 0, &mut BTreeMap::new()).unwrap_err();
        assert!(err.contains("nested more than 8 deep"), "{err}");
    }

    #[test]
    fn lengths_are_checked_against_the_bytes_that_are_there() {
        for p in [
            &[
                0x80, 2, 0x8d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, b'.',
            ][..],
            &[0x80, 2, b'X', 0xff, 0xff, 0xff, 0xff, b'a', b'.'],
            &[0x80, 2, 0x8a, 0xff, 1, b'.'],
        ] {
            let err = unpickle(p).unwrap_err();
            assert!(err.contains("cut short"), "{err}");
        }
    }

    #[test]
    fn negative_and_overflowing_views_are_errors() {
        let storage = Value::Storage(Element::F32, "0".into(), 10);
        let int = |i: i64| Value::Int(i);
        let tuple = |v: &[i64]| Value::Tuple(v.iter().map(|&i| Value::Int(i)).collect());
        for (offset, shape, stride, says) in [
            (-1, vec![2], vec![1], "offset -1"),
            (0, vec![-3], vec![1], "shape -3"),
            (0, vec![1 << 40, 1 << 40], vec![1, 1], "element count overflows"),
            (0, vec![4], vec![i64::MAX], "extent overflows"),
            (
                0,
                vec![11],
                vec![1],
                "reaches element 10 of storage 0, which holds 10",
            ),
            (6, vec![2, 2], vec![4, 1], "reaches element 11"),
        ] {
            let args = [storage.clone(), int(offset), tuple(&shape), tuple(&stride)];
            let err = tensor_ref(&args).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
