//! What a component may ask of the compiler, checked before it is compiled.
//!
//! Cranelift's time grows with the square of the values live at once in a
//! function, and a WebAssembly function can keep as many as it likes on its
//! operand stack: one pushing 20,000 computed values and adding them up (a
//! 92 KB function) compiled in 7.8 s, 10,000 in 2.0 s, and 100,000 did not
//! finish in 120 s, on every core the host has (the twenty-second
//! adversarial read, issue 23). An upload, `inboxd check` and every start
//! compile, so one component could hold a host's cores for hours. Compilers
//! keep the operand stack shallow (values live in locals), so a function
//! may keep at most [`MAX_OPERAND_STACK`] values on it; the check is one
//! pass of wasmparser's validator, the one wasmtime itself uses.

use wasmparser::{FuncValidatorAllocations, Parser, ValidPayload, Validator, WasmFeatures};

/// The most values one function may keep on its operand stack at once:
/// compiled at about 25 ms per function at this depth (see above), where the
/// deepest function of the Python and JavaScript guests (an interpreter
/// each, compiled by LLVM) keeps fewer than a hundred.
pub const MAX_OPERAND_STACK: u32 = 1_024;

/// Refuses a component with a function past [`MAX_OPERAND_STACK`]; an
/// invalid component passes, for wasmtime to refuse with its own message.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let (height, function) = deepest(bytes);
    if height > MAX_OPERAND_STACK {
        return Err(format!(
            "function {function} of one of its core modules keeps {height} values on the operand stack at \
             once; at most {MAX_OPERAND_STACK}: compiling takes time that grows with their square (the \
             compilers of Rust, Python and JavaScript guests keep fewer than a hundred)"
        ));
    }
    Ok(())
}

/// The highest operand stack of any function, and that function's index in
/// its module (0, 0 for a component with no code or one that is invalid).
pub fn deepest(bytes: &[u8]) -> (u32, u32) {
    let mut validator = Validator::new_with_features(WasmFeatures::all());
    let mut allocations = FuncValidatorAllocations::default();
    let mut deepest = (0, 0);
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        let Ok(valid) = validator.payload(&payload) else {
            break;
        };
        if let ValidPayload::Func(function, body) = valid {
            let index = function.index;
            let mut validator = function.into_validator(std::mem::take(&mut allocations));
            let mut reader = body.get_binary_reader();
            let mut height = 0;
            if validator.read_locals(&mut reader).is_ok() {
                while !reader.eof() {
                    let offset = reader.original_position();
                    let visited = reader.visit_operator(&mut validator.visitor(offset));
                    if !matches!(visited, Ok(Ok(()))) {
                        break;
                    }
                    height = height.max(validator.operand_stack_height());
                    // Stop early: no need to read the rest of a refused one.
                    if height > MAX_OPERAND_STACK {
                        break;
                    }
                }
            }
            allocations = validator.into_allocations();
            deepest = deepest.max((height, index));
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module of one function `(param i32) (result i32)` that pushes
    /// `n` computed values (`local.get 0`, `i32.const`, `i32.mul`), then adds
    /// them up: the shape that compiled in time growing with `n` squared.
    fn deep_module(n: u32) -> Vec<u8> {
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
        let mut code = vec![0u8]; // no locals
        for i in 0..n {
            code.extend([0x20, 0x00, 0x41]); // local.get 0, i32.const
            leb(u64::from(i % 64), &mut code); // a small positive constant
            code.push(0x6c); // i32.mul
        }
        code.extend(std::iter::repeat_n(0x6a, n as usize - 1)); // i32.add
        code.push(0x0b);
        let mut body = Vec::new();
        leb(code.len() as u64, &mut body);
        body.extend(code);
        let section = |id: u8, content: &[u8]| {
            let mut out = vec![id];
            leb(content.len() as u64, &mut out);
            out.extend(content);
            out
        };
        let mut codes = vec![1u8];
        codes.extend(body);
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        module.extend(section(1, &[1, 0x60, 1, 0x7f, 1, 0x7f])); // (i32) -> i32
        module.extend(section(3, &[1, 0])); // one function of type 0
        module.extend(section(10, &codes));
        module
    }

    #[test]
    fn a_function_that_keeps_too_many_values_on_its_stack_is_refused_before_compiling() {
        // The last value pushed and its multiplier: one more than `n`.
        let fits = deep_module(MAX_OPERAND_STACK - 1);
        assert_eq!(deepest(&fits), (MAX_OPERAND_STACK, 0));
        assert!(check(&fits).is_ok());
        let deep = deep_module(20_000);
        let err = check(&deep).unwrap_err();
        assert!(
            err.contains("function 0") && err.contains(&format!("at most {MAX_OPERAND_STACK}")),
            "{err}"
        );
        // Through the compile path itself, refused before compiling (which
        // would take minutes in a debug build).
        let engine = wasmtime::Engine::default();
        let Err(err) = super::super::cache::compile(&engine, &deep, None) else {
            panic!("compiled");
        };
        assert!(format!("{err:#}").contains("operand stack"), "{err:#}");
    }

    /// The guests this repository builds (when built: the test command
    /// builds them first) stay far below the bound.
    #[test]
    fn the_repositorys_guests_keep_shallow_operand_stacks() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/target/wasm32-wasip2/release");
        for name in [
            "billing.wasm",
            "notifier.wasm",
            "billing_py.wasm",
            "billing_js.wasm",
        ] {
            let Ok(bytes) = std::fs::read(dir.join(name)) else {
                continue;
            };
            let (height, function) = deepest(&bytes);
            println!("{name}: deepest operand stack {height} (function {function})");
            assert!(height > 0 && height < MAX_OPERAND_STACK / 4, "{name}: {height}");
            assert!(check(&bytes).is_ok());
        }
    }
}
