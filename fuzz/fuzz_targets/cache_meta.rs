#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| surge_fuzz::cache_meta(data));
