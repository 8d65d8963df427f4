//! What a component may ask of the compiler, checked before it is compiled.
//!
//! Cranelift's time grows faster than a function's size in a few shapes
//! (the twenty-second adversarial read and its review, issue 23), measured
//! with wasmtime 48 in release:
//! - values kept on the operand stack: 10,000 compiled in 2.0 s, 20,000
//!   (92 KB) in 7.8 s, 100,000 did not finish in 120 s;
//! - locals live across loads: 10,000 in 2.4 s, 20,000 in 9.1 s;
//! - locals times blocks (the SSA builder's table of each local in each
//!   block, about 4 bytes and 100 ns a pair): 3,000 locals and 100,000
//!   empty blocks (339 KB) took 30 s and 1.2 GB;
//! - values carried across blocks: 1,000 across 100,000 empty blocks took
//!   7.8 s; and blocks with many parameters and results: 1,000 blocks of
//!   1,000 each took 4.4-7.4 s and 4.0 GB (12 KB of code).
//!
//! An upload, `inboxd check` and every start compile, on every core, inside
//! the host. So each function's shape is read first, with wasmparser's
//! validator (the version wasmtime uses), and the component's compile work
//! is bounded: [`Shape::work`] summed over its functions, at most
//! [`MAX_COMPILE_WORK`]. The repository's Python and JavaScript guests (an
//! interpreter each, 19 and 12 MB, compiled by LLVM) need 8.5 and 16.0
//! million; the bound is about 1.6 s of Cranelift's time in these shapes.
//! What is not bounded here, a shape not yet found and plain size (at most
//! `max_component_mb`), meets the compile worker's CPU and memory limits
//! (`super::compile_worker`).

use wasmparser::{
    BlockType, CompositeInnerType, FuncValidatorAllocations, Parser, ValidPayload, Validator, WasmFeatures,
    WasmModuleResources,
};

/// The most values one function may keep on its operand stack at once
/// (within [`MAX_COMPILE_WORK`] too: past this the function is read no
/// further). The guests keep at most 64.
pub const MAX_OPERAND_STACK: u32 = 1_024;

/// The most compile work ([`Shape::work`], summed over every function) a
/// component may ask for: four times the JavaScript guest's.
pub const MAX_COMPILE_WORK: u64 = 64_000_000;

/// Work per unit of a block type's size squared. Regression (the second
/// review of the twenty-second read): 1,000 blocks of 1,000 parameters and
/// results each, no locals, took 4.4-7.4 s and 4.0 GB (2,000: 46 s and
/// 14.9 GB), about 1 ns per unit of (parameters + results) squared, which
/// the other terms counted as 1.6% of the bound.
const BLOCK_TYPE_WEIGHT: u64 = 16;

/// What one function asks of the compiler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// Its index in its core module.
    pub function: u32,
    /// The most values on its operand stack at once.
    pub stack: u32,
    /// Its locals, parameters included.
    pub locals: u32,
    /// Its blocks, loops and ifs.
    pub blocks: u32,
    /// Values on the operand stack as each block opens and ends, summed
    /// over its blocks (each is carried across the block's edges).
    pub carried: u64,
    /// Each block's parameters and results, squared, summed over its blocks.
    pub block_types: u64,
}

impl Shape {
    /// Its compile work in the shapes where Cranelift's time grows faster
    /// than size: values on the operand stack and locals, each squared, four
    /// per pair of a local and a block and per value carried across a
    /// block's edge (each unit about 25 ns), and each block's parameters and
    /// results squared, weighted [`BLOCK_TYPE_WEIGHT`].
    pub fn work(&self) -> u64 {
        let (stack, locals, blocks) = (
            u64::from(self.stack),
            u64::from(self.locals),
            u64::from(self.blocks),
        );
        (stack * stack + locals * locals + 4 * locals * blocks)
            .saturating_add(self.carried.saturating_mul(4))
            .saturating_add(self.block_types.saturating_mul(BLOCK_TYPE_WEIGHT))
    }
}

/// Refuses a component whose compile work is past [`MAX_COMPILE_WORK`] (or
/// a function past [`MAX_OPERAND_STACK`]), or one the validator cannot read
/// (with every feature on, so what wasmtime accepts it accepts: a component
/// it could not read to the end could hide a function behind the place it
/// stopped).
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let mut total = 0u64;
    let mut dearest = Shape::default();
    // The caller says the component is invalid; wasmparser says where.
    shapes(bytes, |shape| {
        total = total.saturating_add(shape.work());
        if shape.work() > dearest.work() {
            dearest = *shape;
        }
        shape.stack <= MAX_OPERAND_STACK && total <= MAX_COMPILE_WORK
    })
    .map_err(|e| e.to_string())?;
    let Shape {
        function,
        stack,
        locals,
        blocks,
        carried,
        block_types,
    } = dearest;
    if stack > MAX_OPERAND_STACK || total > MAX_COMPILE_WORK {
        return Err(format!(
            "compiling it would take time and memory that grow faster than its size, on every core of the \
             host: its functions' compile work (values on the operand stack and locals, each squared, 4 \
             per pair of a local and a block and per value carried across a block's edge, and 16 per \
             unit of each block's parameters and results squared) comes to more than {MAX_COMPILE_WORK} \
             (the Python and JavaScript guests need about 15 million); the dearest is function {function} \
             of one of its core modules, with {stack} values on the operand stack at once (at most \
             {MAX_OPERAND_STACK}), {locals} locals, {blocks} blocks, {carried} values carried across \
             their edges and {block_types} units of block types"
        ));
    }
    Ok(())
}

/// Calls `each` with every function's shape until it returns false (a
/// function past [`MAX_OPERAND_STACK`] is read no further than that).
pub fn shapes(
    bytes: &[u8],
    mut each: impl FnMut(&Shape) -> bool,
) -> Result<(), wasmparser::BinaryReaderError> {
    let mut validator = Validator::new_with_features(WasmFeatures::all());
    let mut allocations = FuncValidatorAllocations::default();
    for payload in Parser::new(0).parse_all(bytes) {
        if let ValidPayload::Func(function, body) = validator.payload(&payload?)? {
            let mut shape = Shape {
                function: function.index,
                ..Shape::default()
            };
            let mut validator = function.into_validator(std::mem::take(&mut allocations));
            let mut reader = body.get_binary_reader();
            validator.read_locals(&mut reader)?;
            shape.locals = validator.len_locals();
            let mut frames = validator.control_stack_height();
            while !reader.eof() {
                let offset = reader.original_position();
                reader.visit_operator(&mut validator.visitor(offset))??;
                let height = validator.operand_stack_height();
                shape.stack = shape.stack.max(height);
                let now = validator.control_stack_height();
                if now > frames {
                    // A block opened (its parameters still count as on the stack).
                    shape.blocks += 1;
                    shape.carried = shape.carried.saturating_add(u64::from(height));
                    let arity = validator
                        .get_control_frame(0)
                        .map_or(0, |frame| block_arity(validator.resources(), frame.block_type));
                    shape.block_types = shape.block_types.saturating_add(arity * arity);
                } else if now < frames {
                    // A block ended, its results on the stack.
                    shape.carried = shape.carried.saturating_add(u64::from(height));
                }
                frames = now;
                if shape.stack > MAX_OPERAND_STACK {
                    break;
                }
            }
            allocations = validator.into_allocations();
            if !each(&shape) {
                break;
            }
        }
    }
    Ok(())
}

/// A block type's parameters and results.
fn block_arity(resources: &impl WasmModuleResources, block: BlockType) -> u64 {
    match block {
        BlockType::Empty => 0,
        BlockType::Type(_) => 1,
        BlockType::FuncType(index) => match resources.sub_type_at(index).map(|t| &t.composite_type.inner) {
            Some(CompositeInnerType::Func(f)) => (f.params().len() + f.results().len()) as u64,
            _ => 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of the deepest function.
    fn deepest(bytes: &[u8]) -> Shape {
        let mut deepest = Shape::default();
        shapes(bytes, |s| {
            if s.stack > deepest.stack {
                deepest = *s;
            }
            true
        })
        .unwrap();
        deepest
    }

    fn leb(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    /// A core module of one function `(param i32) (result i32)` with
    /// `locals` more i32 locals and `code` (its operators, without the end).
    fn module(locals: u32, code: &[u8]) -> Vec<u8> {
        typed_module(locals, code, 0)
    }

    /// As [`module`], with a second type, `arity` i32s to `arity` i32s (for
    /// block types: type index 1).
    fn typed_module(locals: u32, code: &[u8], arity: u32) -> Vec<u8> {
        let mut function = Vec::new();
        if locals == 0 {
            function.push(0);
        } else {
            function.push(1);
            leb(u64::from(locals), &mut function);
            function.push(0x7f);
        }
        function.extend(code);
        function.push(0x0b);
        let mut codes = vec![1u8];
        leb(function.len() as u64, &mut codes);
        codes.extend(function);
        let section = |id: u8, content: &[u8]| {
            let mut out = vec![id];
            leb(content.len() as u64, &mut out);
            out.extend(content);
            out
        };
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        let mut types = vec![2, 0x60, 1, 0x7f, 1, 0x7f, 0x60]; // (i32) -> i32, then
        for _ in 0..2 {
            leb(u64::from(arity), &mut types);
            types.extend(std::iter::repeat_n(0x7f, arity as usize));
        }
        module.extend(section(1, &types));
        module.extend(section(3, &[1, 0])); // one function of type 0
        module.extend(section(10, &codes));
        module
    }

    /// One function that pushes `n` computed values (`local.get 0`,
    /// `i32.const`, `i32.mul`), then adds them up: the shape that compiled
    /// in time growing with `n` squared.
    fn deep_module(n: u32) -> Vec<u8> {
        let mut code = Vec::new();
        for i in 0..n {
            code.extend([0x20, 0x00, 0x41]); // local.get 0, i32.const
            leb(u64::from(i % 64), &mut code); // a small positive constant
            code.push(0x6c); // i32.mul
        }
        code.extend(std::iter::repeat_n(0x6a, n as usize - 1)); // i32.add
        module(0, &code)
    }

    /// One function with `locals` locals and `blocks` empty blocks.
    fn blocks_module(locals: u32, blocks: u32) -> Vec<u8> {
        let mut code = Vec::new();
        for _ in 0..blocks {
            code.extend([0x02, 0x40, 0x0b]); // block (no result) end
        }
        code.extend([0x20, 0x00]); // local.get 0
        module(locals, &code)
    }

    /// Regression (the second review of the twenty-second read): values on
    /// the stack carried across many blocks, and blocks of many parameters
    /// and results, cost more than their bytes (1,000 values across 100,000
    /// blocks: 7.8 s; 1,000 blocks of 1,000 parameters and results: 4.4 s
    /// and 4.0 GB from 12 KB).
    #[test]
    fn values_carried_across_blocks_and_wide_block_types_are_refused_before_compiling() {
        let carried = |values: u32, blocks: u32| {
            let mut code = Vec::new();
            for _ in 0..values {
                code.extend([0x20, 0x00]); // local.get 0
            }
            for _ in 0..blocks {
                code.extend([0x02, 0x40, 0x0b]); // block (no result) end
            }
            code.extend(std::iter::repeat_n(0x6a, values as usize - 1)); // i32.add
            module(0, &code)
        };
        assert!(check(&carried(100, 1_000)).is_ok());
        let err = check(&carried(1_000, 20_000)).unwrap_err();
        assert!(err.contains("carried across"), "{err}");
        let wide = |arity: u32, blocks: u32| {
            let mut code = Vec::new();
            for _ in 0..arity {
                code.extend([0x20, 0x00]);
            }
            for _ in 0..blocks {
                code.extend([0x02, 0x01, 0x0b]); // block (type 1) end
            }
            code.extend(std::iter::repeat_n(0x6a, arity as usize - 1));
            typed_module(0, &code, arity)
        };
        assert!(check(&wide(2, 1_000)).is_ok());
        let err = check(&wide(1_000, 1_000)).unwrap_err();
        assert!(err.contains("1000 blocks"), "{err}");
    }

    /// Regression (the review of the twenty-second read): the SSA builder's
    /// table of every local in every block, and locals live at once, both
    /// cost more than their bytes (3,000 locals and 100,000 blocks: 30 s and
    /// 1.2 GB; 20,000 locals read from memory: 9.1 s).
    #[test]
    fn many_locals_or_locals_times_blocks_are_refused_before_compiling() {
        assert!(check(&blocks_module(300, 1_000)).is_ok());
        for (locals, blocks) in [(3_000, 100_000), (9_000, 0)] {
            let err = check(&blocks_module(locals, blocks)).unwrap_err();
            assert!(
                err.contains(&format!("{} locals, {blocks} blocks", locals + 1)),
                "{locals} x {blocks}: {err}"
            );
        }
    }

    #[test]
    fn a_function_that_keeps_too_many_values_on_its_stack_is_refused_before_compiling() {
        // The last value pushed and its multiplier: one more than `n`.
        let fits = deep_module(MAX_OPERAND_STACK - 1);
        assert_eq!(deepest(&fits).stack, MAX_OPERAND_STACK);
        assert!(check(&fits).is_ok());
        let deep = deep_module(20_000);
        let err = check(&deep).unwrap_err();
        assert!(
            err.contains("function 0") && err.contains(&format!("at most {MAX_OPERAND_STACK}")),
            "{err}"
        );
        // Through the compile path itself, refused before compiling (which
        // would take minutes in a debug build).
        let config = crate::config::WasmConfig {
            cache_dir: None,
            ..Default::default()
        };
        let engine = super::super::WasmEngine::new(&config).expect("engine");
        let Err(err) = super::super::cache::compile(&engine, &deep) else {
            panic!("compiled");
        };
        assert!(format!("{err:#}").contains("operand stack"), "{err:#}");
        // One that cannot be read to its end is refused, not passed: a deep
        // function could stand behind the place the reading stopped.
        let mut cut = fits.clone();
        cut.truncate(fits.len() - 3);
        let err = check(&cut).unwrap_err();
        assert!(err.contains("unexpected end"), "{err}");
    }

    /// The guests this repository builds (when built: the test command
    /// builds them first) stay far below the bounds.
    #[test]
    fn the_repositorys_guests_ask_little_of_the_compiler() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/target/wasm32-wasip2/release");
        for name in [
            "billing.wasm",
            "notifier.wasm",
            "hostile.wasm",
            "billing_py.wasm",
            "billing_js.wasm",
        ] {
            let Ok(bytes) = std::fs::read(dir.join(name)) else {
                continue;
            };
            let (mut work, mut deepest) = (0u64, 0);
            shapes(&bytes, |s| {
                work += s.work();
                deepest = deepest.max(s.stack);
                true
            })
            .unwrap();
            println!("{name}: compile work {work}, deepest operand stack {deepest}");
            assert!(work > 0 && work < MAX_COMPILE_WORK / 3, "{name}: {work}");
            assert!(deepest < MAX_OPERAND_STACK / 8, "{name}: {deepest}");
            assert!(check(&bytes).is_ok());
        }
    }
}
