#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| surge_fuzz::trace_import(data));
