//! How much zero a component's memory images may add to its compiled form.
//!
//! wasmtime turns a core module's data segments into one image of its
//! initial memory, mapped copy-on-write at instantiation. It makes one when
//! the initialized range is less than twice the data in it, and also, dense
//! or not, when the range is at most 16 MiB (`Config::
//! memory_guaranteed_dense_image_size`). The image is stored in the compiled
//! artifact, which the host reads, copies and keeps, and writes to the
//! compile cache. So a 34-byte module of two one-byte segments 16 MiB apart
//! compiled to 16 MiB, never instantiated or not: 48 of them appended to a
//! component (1.6 KB) made an 806 MB artifact that the host held twice
//! (1.6 GB) and left on disk (the review of issue 23, today).
//!
//! Lowering that 16 MiB would take the JavaScript guest's image away (its
//! 3.3 MB of data span 8.5 MB), and with it copy-on-write instantiation. So
//! this counts the zeros instead: each image wasmtime would make beyond
//! twice its data, the range minus the data, summed over every core module
//! of the component, at most [`MAX_SPARSE_IMAGE_BYTES`]. A dense image is
//! at most twice its data, which the component's size bounds already.

use wasmparser::{DataKind, Operator, Parser, Payload};

/// The zeros (initialized range minus data) that images made only because
/// they are small may add, over the whole component. The JavaScript guest
/// adds 5.2 MB; the Rust and Python guests' images are dense.
pub const MAX_SPARSE_IMAGE_BYTES: u64 = 16 << 20;

/// The largest range wasmtime images whatever its density (its default).
const ALWAYS_IMAGED_BYTES: u64 = 16 << 20;

/// Data segments of one memory of one core module.
#[derive(Default)]
struct Extent {
    data: u64,
    start: u64,
    end: u64,
}

impl Extent {
    fn add(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        if self.data == 0 {
            self.start = start;
        }
        self.data += len;
        self.start = self.start.min(start);
        self.end = self.end.max(start.saturating_add(len));
    }

    /// The zeros wasmtime's image of this memory would hold beyond what
    /// density allows anyway (0 if it makes none, or a dense one).
    fn sparse_bytes(&self) -> u64 {
        let range = self.end - self.start;
        if self.data == 0 || range < self.data.saturating_mul(2) || range > ALWAYS_IMAGED_BYTES {
            return 0;
        }
        range - self.data
    }
}

/// Refuses a component whose memory images would hold more than
/// [`MAX_SPARSE_IMAGE_BYTES`] of zeros past their density.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let sparse = sparse_image_bytes(bytes).map_err(|e| e.to_string())?;
    if sparse > MAX_SPARSE_IMAGE_BYTES {
        return Err(format!(
            "its data segments would compile to memory images holding {} MiB of zeros (the range each \
             module's segments span, less their data, where the data fills less than half of it); at \
             most {} MiB: the compiled form is stored, read and kept by the host",
            sparse.div_ceil(1 << 20),
            MAX_SPARSE_IMAGE_BYTES >> 20
        ));
    }
    Ok(())
}

/// The zeros of every image wasmtime would make from `bytes`' core modules.
/// A module whose segments wasmtime cannot place statically (an offset read
/// from a global) gets no image, as in wasmtime; a segment out of its
/// memory's bounds is counted anyway (wasmtime would make none: counting
/// it only refuses sooner).
pub fn sparse_image_bytes(bytes: &[u8]) -> Result<u64, wasmparser::BinaryReaderError> {
    let mut total = 0u64;
    // One entry per module or component being read (they nest); a module's
    // entry holds its memories' extents, or `None` once it has no image.
    let mut open: Vec<Option<Vec<Extent>>> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload? {
            Payload::Version { encoding, .. } => open.push(match encoding {
                wasmparser::Encoding::Module => Some(Vec::new()),
                wasmparser::Encoding::Component => None,
            }),
            Payload::DataSection(reader) => {
                let Some(Some(memories)) = open.last_mut() else {
                    continue;
                };
                let mut placed = true;
                for data in reader {
                    let data = data?;
                    let DataKind::Active {
                        memory_index,
                        offset_expr,
                    } = data.kind
                    else {
                        continue;
                    };
                    let start = match offset_expr.get_operators_reader().read()? {
                        Operator::I32Const { value } => u64::from(value.cast_unsigned()),
                        Operator::I64Const { value } => value.cast_unsigned(),
                        _ => {
                            placed = false;
                            break;
                        }
                    };
                    let memory = memory_index as usize;
                    if memories.len() <= memory {
                        memories.resize_with(memory + 1, Extent::default);
                    }
                    memories[memory].add(start, data.data.len() as u64);
                }
                if !placed {
                    *open.last_mut().expect("inside a module") = None;
                }
            }
            Payload::End(_) => {
                if let Some(Some(memories)) = open.pop() {
                    let sparse: u64 = memories.iter().map(Extent::sparse_bytes).sum();
                    total = total.saturating_add(sparse);
                }
            }
            _ => {}
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component of `modules` core modules, each two one-byte segments
    /// `gap` bytes apart in a memory of 256 pages.
    fn sparse_component(modules: usize, gap: u32) -> Vec<u8> {
        let module = format!(
            r#"(core module (memory 256) (data (i32.const 0) "\01") (data (i32.const {gap}) "\01"))"#
        );
        wat::parse_str(format!("(component {})", module.repeat(modules))).expect("valid WAT")
    }

    #[test]
    fn sparse_images_are_counted_and_bounded_over_the_component() {
        // One module just under the always-imaged range: 16 MiB of zeros.
        let one = sparse_component(1, (16 << 20) - 2);
        assert_eq!(sparse_image_bytes(&one).unwrap(), (16 << 20) - 3);
        assert!(check(&one).is_ok());
        // Two of them (the review's attack appended 48).
        let err = check(&sparse_component(2, (16 << 20) - 2)).unwrap_err();
        assert!(
            err.contains("32 MiB of zeros") && err.contains("at most 16 MiB"),
            "{err}"
        );
        // Past 16 MiB wasmtime makes no image, and dense ones are not zeros.
        assert_eq!(sparse_image_bytes(&sparse_component(4, 16 << 20)).unwrap(), 0);
        assert_eq!(sparse_image_bytes(&sparse_component(4, 1)).unwrap(), 0);
    }

    #[test]
    fn a_segment_placed_by_a_global_means_no_image() {
        let bytes = wat::parse_str(
            r#"(component (core module (memory 256) (global i32 (i32.const 0))
                 (data (i32.const 0) "\01") (data (global.get 0) "\01") (data (i32.const 1000000) "\01")))"#,
        )
        .expect("valid WAT");
        assert_eq!(sparse_image_bytes(&bytes).unwrap(), 0);
    }

    /// The guests this repository builds (when built) are within the bound.
    #[test]
    fn the_repositorys_guests_fit() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/target/wasm32-wasip2/release");
        for name in ["billing", "billing_py", "billing_js"] {
            let Ok(bytes) = std::fs::read(dir.join(format!("{name}.wasm"))) else {
                continue;
            };
            check(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
