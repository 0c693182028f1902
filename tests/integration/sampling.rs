//! Sampling at the default rate: kept memory is estimated within 10%, and a
//! site that keeps nothing is estimated near zero.

use crate::harness::{
    compile_c,
    sites::{per_site, trace_sites_to_json, O2_FLAGS},
    Target,
};

const KEPT: f64 = (128u64 << 20) as f64;

/// The relative standard error of a site's estimate is about
/// sqrt(R / bytes): 2–3% here at R = 64 KiB, so 10% is over 3 standard
/// errors; the test runs the trace twice to show it holds across runs.
#[test]
fn default_sampling_estimates_kept_sites_within_ten_percent() {
    let bin = compile_c("accuracy", "O2", O2_FLAGS);
    for run in 0..2 {
        let mut target = Target::start(&bin, &[]);
        let report =
            trace_sites_to_json(&mut target, &format!("accuracy-{run}"), false, libc::SIGINT);
        let rate = report["sample_rate"].as_u64().expect("sample_rate");
        assert!(rate > 1, "the default samples: {rate}");
        let sites = per_site(&report);
        for site in ["keep_1k", "keep_16k"] {
            let inuse = sites.get(site).map_or(0, |c| c[0]) as f64;
            let error = inuse / KEPT - 1.0;
            assert!(
                error.abs() < 0.10,
                "run {run}: {site} estimated {inuse} of {KEPT}: {error:+.3}"
            );
        }
        let churn = sites.get("churn").copied().unwrap_or_default();
        assert!(
            churn[3] > 0,
            "run {run}: the churn site was sampled: {sites:?}"
        );
        assert_eq!(churn[0], 0, "run {run}: churn keeps nothing: {sites:?}");
        let losses = &report["losses"];
        for key in [
            "ringbuf_full",
            "live_map_full",
            "stack_lost",
            "stale_inflight",
        ] {
            assert_eq!(losses[key], 0, "run {run}: {key} in {losses}");
        }
    }
}
