#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nearrec_fuzz::tzrec_dump(data));
