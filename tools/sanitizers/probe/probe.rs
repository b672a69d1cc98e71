//! Reads one byte past an 8-byte heap allocation, or (under rustc's UB
//! checks) makes a slice from a null pointer: what tools/sanitize.sh
//! expects its runtime, or the checks, to stop.

#[no_mangle]
pub extern "C" fn probe_rust_heap_overflow(n: usize) -> u8 {
    let v = std::hint::black_box(vec![1u8; 8]);
    // SAFETY: none; n = 8 is the invalid access the sanitizer must report.
    unsafe { std::ptr::read_volatile(v.as_ptr().add(n)) }
}

#[no_mangle]
pub extern "C" fn probe_rust_null_slice(len: usize) -> usize {
    let p: *const u8 = std::hint::black_box(std::ptr::null());
    // SAFETY: none; from_raw_parts' precondition check must abort.
    unsafe { std::slice::from_raw_parts(p, len) }.len()
}
