//! Arbitrary bytes into the plan parser: a clear error or a valid config, never a panic; a valid
//! config always builds a limiter.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tollgate::{FakeClock, Limiter, PlanConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match PlanConfig::parse(text) {
        Ok(config) => {
            let built = Limiter::<u64>::builder()
                .plans(config)
                .clock(FakeClock::new())
                .build();
            assert!(
                built.is_ok(),
                "a parsed config must build: {:?}",
                built.err()
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
