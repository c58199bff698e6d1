//! Failpoints compiled only with the `failpoints` feature (tests): a named point can be
//! armed through the `AIRLOCK_FAILPOINTS` environment variable (comma-separated names),
//! and `hit` then returns true there. Without the feature `hit` is a constant `false`.

#[cfg(feature = "failpoints")]
pub fn hit(name: &str) -> bool {
    std::env::var("AIRLOCK_FAILPOINTS")
        .map(|v| v.split(',').any(|p| p.trim() == name))
        .unwrap_or(false)
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> bool {
    false
}
