//! The speed verdict of a qualification, recomputed by the host from its own stamps.
//!
//! Input: the policy's reviewed `speed` section and the host-stamped windows of the three reads
//! B (incumbent), C (candidate) and B′ (incumbent again). Output: a [`SpeedRecord`] holding
//! every number that enters the verdict, so [`decide`] run on a receipt's windows gives the same
//! record bit for bit (integers only: rates in thousandths of a token per second, ratios in
//! basis points, 10 000 = 1×). Nothing the engine or the worker says about time is used.
//!
//! The rules, in the order they apply:
//! 1. A read's rate is its timed tokens over the host span from the first timed request sent to
//!    the last timed response received. Its scatter is the spread of its per-window rates,
//!    (max − min) / median. A read with fewer timed windows than the policy's minimum is a plan
//!    the host should not have run: no-decision.
//! 2. Both baseline reads must be usable (scatter within bounds), or the host has no baseline:
//!    **no-decision** (the host failed to measure, not the candidate). The baseline is B and B′
//!    when their noise, |B − B′| / mean (rounded up), is at most `max-noise-bp`. Otherwise
//!    (bracket drift) the later bracket is dropped and C against B decides: B's two halves (its
//!    timed windows split in order) stand in as the two baseline reads, and the noise is never
//!    taken below `max-noise-bp` — a drift never lowers the bar. Halves whose own noise is
//!    above the bound leave no baseline: no-decision. A baseline rate of zero is no
//!    measurement: no-decision.
//! 3. A C whose windows scatter beyond the bound is not proven faster: FAIL.
//! 4. A conditioning regression (C's conditioning span above `max-conditioning-slowdown-bp`
//!    of B's) is a FAIL.
//! 5. required = 1 + max(margin, multiplier × noise), rounded up. PASS when C / max(baseline) ≥ required;
//!    FAIL when C / min(baseline) < required; anything between is undetermined, which is a
//!    FAIL ("not proven faster", never deferred). There is no adaptive escalation: B, C, B′ are
//!    the only reads, every time.
//!
//! What it does not own: running the reads (the qualify command), the launch comparison, the
//! lanes.

use crate::receipt::{LanePhase, LaneWindow};
use serde::{Deserialize, Serialize};

/// The reviewed speed verdict of a qualification (seed 001 §4), integers only: ratios are
/// basis points (10 000 = 1×), so the verdict is recomputed bit for bit from a receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Speed {
    /// The least speedup over the baseline, above 1×, that can pass.
    pub min_margin_bp: u64,
    /// Multiplies the baseline's noise: the margin required is at least this times the noise.
    pub noise_multiplier_bp: u64,
    /// The most relative spread of the two baseline reads the host accepts as one baseline.
    pub max_noise_bp: u64,
    /// The fewest timed windows a read must have.
    pub min_timed_windows: u64,
    /// The most relative spread of one read's timed windows (per-window rates).
    pub max_window_scatter_bp: u64,
    /// The most the candidate's conditioning time may be, relative to the incumbent's.
    pub max_conditioning_slowdown_bp: u64,
}

/// 1× in basis points.
pub const ONE: u64 = 10_000;

/// What the host measured of one read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFacts {
    /// Timed windows.
    pub windows: u64,
    /// Timed tokens.
    pub tokens: u64,
    /// The host span of the timed windows, ns.
    pub span_ns: u64,
    /// Timed tokens per second, in thousandths.
    pub rate_milli: u64,
    /// The spread of its per-window rates, basis points of their median.
    pub scatter_bp: u64,
    /// The host span of its conditioning windows, ns (none when the workload has none).
    pub conditioning_ns: Option<u64>,
}

/// What the baseline was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// B and B′.
    Bracketed,
    /// B′ was dropped (drift, or its windows scattered): B's two halves.
    Drift,
}

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Proven faster by the required margin.
    Pass,
    /// Not proven faster, or a regression.
    Fail,
    /// The host could not measure.
    NoDecision,
}

/// Every number that enters the verdict, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpeedRecord {
    /// Read B.
    pub b: ReadFacts,
    /// Read C.
    pub c: ReadFacts,
    /// Read B′.
    pub b2: ReadFacts,
    /// The two baseline rates the verdict used (B and B′, or B's halves), in thousandths.
    pub baseline_milli: [u64; 2],
    /// Which baseline.
    pub baseline: Baseline,
    /// B against B′ (before the drift rule), basis points.
    pub bracket_noise_bp: u64,
    /// The noise of the baseline used, basis points.
    pub noise_bp: u64,
    /// 1 + max(margin, multiplier × noise), basis points.
    pub required_bp: u64,
    /// C over the mean of the baseline, basis points.
    pub speedup_bp: u64,
    /// C over the baseline's maximum (floor), basis points.
    pub low_bp: u64,
    /// C over the baseline's minimum (floor), basis points.
    pub high_bp: u64,
    /// The verdict.
    pub verdict: Verdict,
    /// Its reason code (`speed.pass`, `speed.not-proven`, …).
    pub code: String,
    /// For people.
    pub reason: String,
}

fn timed(windows: &[LaneWindow]) -> Vec<&LaneWindow> {
    windows
        .iter()
        .filter(|w| w.phase == LanePhase::Timed)
        .collect()
}

/// Tokens over a host span, in thousandths per second.
fn rate(tokens: u64, span_ns: u64) -> u64 {
    let r = u128::from(tokens) * 1_000_000_000_000 / u128::from(span_ns.max(1));
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// The span from the first window sent to the last received, and the tokens of `ws`.
fn span(ws: &[&LaneWindow]) -> (u64, u64) {
    let tokens = ws.iter().map(|w| u64::from(w.tokens)).sum();
    let span = match (ws.first(), ws.last()) {
        (Some(a), Some(z)) => z.received_ns.saturating_sub(a.sent_ns),
        _ => 0,
    };
    (tokens, span)
}

/// `part` over `whole`, basis points (floor; a zero `whole` counts as 1).
fn bp(part: u64, whole: u64) -> u64 {
    u64::try_from(u128::from(part) * u128::from(ONE) / u128::from(whole.max(1))).unwrap_or(u64::MAX)
}

/// |a − b| over their mean, basis points, rounded up (the host never understates its noise).
fn noise(a: u64, b: u64) -> u64 {
    let sum = u128::from(a) + u128::from(b);
    let diff = u128::from(a.abs_diff(b)) * u128::from(ONE) * 2;
    u64::try_from(diff.div_ceil(sum.max(1))).unwrap_or(u64::MAX)
}

/// What the host measured of one read's windows.
#[must_use]
pub fn facts(windows: &[LaneWindow]) -> ReadFacts {
    let t = timed(windows);
    let (tokens, span_ns) = span(&t);
    let mut rates: Vec<u64> = t
        .iter()
        .map(|w| rate(u64::from(w.tokens), w.received_ns.saturating_sub(w.sent_ns)))
        .collect();
    rates.sort_unstable();
    let scatter_bp = match (rates.first(), rates.last()) {
        (Some(lo), Some(hi)) => bp(hi - lo, rates[(rates.len() - 1) / 2]),
        _ => 0,
    };
    let conditioning: Vec<&LaneWindow> = windows
        .iter()
        .filter(|w| w.phase == LanePhase::Conditioning)
        .collect();
    ReadFacts {
        windows: t.len() as u64,
        tokens,
        span_ns,
        rate_milli: rate(tokens, span_ns),
        scatter_bp,
        conditioning_ns: (!conditioning.is_empty()).then(|| span(&conditioning).1),
    }
}

/// The rates of a read's two halves (its timed windows split in order).
fn halves(windows: &[LaneWindow]) -> [u64; 2] {
    let t = timed(windows);
    let (first, second) = t.split_at(t.len() / 2);
    let r = |ws: &[&LaneWindow]| {
        let (tokens, span_ns) = span(ws);
        rate(tokens, span_ns)
    };
    [r(first), r(second)]
}

/// The verdict from the three reads' windows under `policy`.
#[must_use]
pub fn decide(
    policy: &Speed,
    b: &[LaneWindow],
    c: &[LaneWindow],
    b2: &[LaneWindow],
) -> SpeedRecord {
    let (fb, fc, fb2) = (facts(b), facts(c), facts(b2));
    let bracket_noise_bp = noise(fb.rate_milli, fb2.rate_milli);
    let (baseline, baseline_milli, noise_bp) = if bracket_noise_bp <= policy.max_noise_bp {
        (
            Baseline::Bracketed,
            [fb.rate_milli, fb2.rate_milli],
            bracket_noise_bp,
        )
    } else {
        let h = halves(b);
        // After a drift the host trusts its baseline less, never more.
        (
            Baseline::Drift,
            h,
            noise(h[0], h[1]).max(policy.max_noise_bp),
        )
    };
    let multiplied = u64::try_from(
        (u128::from(policy.noise_multiplier_bp) * u128::from(noise_bp)).div_ceil(u128::from(ONE)),
    )
    .unwrap_or(u64::MAX);
    let required_bp = ONE.saturating_add(policy.min_margin_bp.max(multiplied));
    let (lo, hi) = (
        baseline_milli[0].min(baseline_milli[1]),
        baseline_milli[0].max(baseline_milli[1]),
    );
    let mean = u64::try_from((u128::from(lo) + u128::from(hi)) / 2).unwrap_or(u64::MAX);
    let mut record = SpeedRecord {
        b: fb,
        c: fc,
        b2: fb2,
        baseline_milli,
        baseline,
        bracket_noise_bp,
        noise_bp,
        required_bp,
        speedup_bp: 0,
        low_bp: 0,
        high_bp: 0,
        verdict: Verdict::NoDecision,
        code: String::new(),
        reason: String::new(),
    };
    record.speedup_bp = bp(record.c.rate_milli, mean);
    record.low_bp = bp(record.c.rate_milli, hi);
    record.high_bp = bp(record.c.rate_milli, lo);
    let (verdict, code, reason) = judge(policy, &record);
    record.verdict = verdict;
    record.code = code.to_owned();
    record.reason = reason;
    record
}

fn judge(policy: &Speed, r: &SpeedRecord) -> (Verdict, &'static str, String) {
    let min = policy.min_timed_windows;
    if let Some((name, f)) = [("B", &r.b), ("C", &r.c), ("B′", &r.b2)]
        .into_iter()
        .find(|(_, f)| f.windows < min)
    {
        return (
            Verdict::NoDecision,
            "speed.plan",
            format!(
                "read {name} has {} timed windows, fewer than the policy's {min}",
                f.windows
            ),
        );
    }
    let scatter = policy.max_window_scatter_bp;
    if let Some((name, f)) = [("B", &r.b), ("B′", &r.b2)]
        .into_iter()
        .find(|(_, f)| f.scatter_bp > scatter)
    {
        return (
            Verdict::NoDecision,
            "speed.baseline",
            format!(
                "the incumbent's read {name} scattered {} bp, above {scatter} bp: fewer than two usable baseline reads",
                f.scatter_bp
            ),
        );
    }
    if r.baseline_milli.contains(&0) {
        return (
            Verdict::NoDecision,
            "speed.baseline",
            "a baseline rate is zero: no measurement".into(),
        );
    }
    if r.baseline == Baseline::Drift && r.noise_bp > policy.max_noise_bp {
        return (
            Verdict::NoDecision,
            "speed.noise",
            format!(
                "B and B′ differ by {} bp and B's halves by {} bp, above the maximum noise of {} bp: the host could not keep its baseline",
                r.bracket_noise_bp, r.noise_bp, policy.max_noise_bp
            ),
        );
    }
    if r.c.scatter_bp > scatter {
        return (
            Verdict::Fail,
            "speed.scatter",
            format!(
                "the candidate's timed windows scattered {} bp, above {scatter} bp: not proven faster",
                r.c.scatter_bp
            ),
        );
    }
    if let (Some(cc), Some(cb)) = (r.c.conditioning_ns, r.b.conditioning_ns)
        && u128::from(cc) * u128::from(ONE)
            > u128::from(policy.max_conditioning_slowdown_bp) * u128::from(cb)
    {
        return (
            Verdict::Fail,
            "speed.conditioning",
            format!(
                "the candidate conditioned in {cc} ns against the incumbent's {cb} ns, above the allowed {} bp",
                policy.max_conditioning_slowdown_bp
            ),
        );
    }
    let c = u128::from(r.c.rate_milli) * u128::from(ONE);
    let need = |base: u64| u128::from(r.required_bp) * u128::from(base);
    let lo = r.baseline_milli[0].min(r.baseline_milli[1]);
    let hi = r.baseline_milli[0].max(r.baseline_milli[1]);
    if c >= need(hi) {
        (
            Verdict::Pass,
            "speed.pass",
            format!(
                "C is at least {} bp of the faster baseline, required {} bp",
                r.low_bp, r.required_bp
            ),
        )
    } else if c < need(lo) {
        (
            Verdict::Fail,
            "speed.slower",
            format!(
                "C is at most {} bp of the slower baseline, required {} bp",
                r.high_bp, r.required_bp
            ),
        )
    } else {
        (
            Verdict::Fail,
            "speed.not-proven",
            format!(
                "C is between {} and {} bp of the baseline, required {} bp: not proven faster",
                r.low_bp, r.high_bp, r.required_bp
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn policy() -> Speed {
        Speed {
            min_margin_bp: 500,
            noise_multiplier_bp: 30_000,
            max_noise_bp: 1_000,
            min_timed_windows: 4,
            max_window_scatter_bp: 5_000,
            max_conditioning_slowdown_bp: 12_000,
        }
    }

    /// A read: conditioning windows, then timed windows, each of 10 tokens taking the given
    /// milliseconds, back to back.
    fn read(conditioning: &[u64], timed: &[u64]) -> Vec<LaneWindow> {
        let mut at = 0;
        let phases = conditioning
            .iter()
            .map(|d| (LanePhase::Conditioning, d))
            .chain(timed.iter().map(|d| (LanePhase::Timed, d)));
        phases
            .enumerate()
            .map(|(i, (phase, d))| {
                let w = LaneWindow {
                    index: u32::try_from(i).unwrap(),
                    phase,
                    tokens: 10,
                    sent_ns: at,
                    received_ns: at + d * MS,
                };
                at += d * MS;
                w
            })
            .collect()
    }

    fn even(ms: u64) -> Vec<LaneWindow> {
        read(&[], &[ms; 8])
    }

    /// Reads with too few timed windows — none, or one, which the policy's own bound (at least 2)
    /// never admits but a receipt could carry — are a plan the host should not have run, never
    /// a panic; an even count's scatter is taken over the lower median (the larger scatter: the
    /// host never understates a read's instability).
    #[test]
    fn too_few_windows_are_a_plan_error_and_an_even_count_takes_the_lower_median() {
        for timed in [&[][..], &[100][..]] {
            let few = read(&[], timed);
            let r = decide(&policy(), &even(100), &few, &even(100));
            assert_eq!(
                (r.verdict, r.code.as_str()),
                (Verdict::NoDecision, "speed.plan")
            );
            let r = decide(&policy(), &few, &even(50), &few);
            assert_eq!(
                (r.verdict, r.code.as_str()),
                (Verdict::NoDecision, "speed.plan")
            );
        }
        // Rates 100, 100, 50, 50 tokens/s: (100 − 50) over the lower median 50 is 10 000 bp;
        // the upper median would say 5 000.
        let f = facts(&read(&[], &[100, 100, 200, 200]));
        assert_eq!(f.scatter_bp, 10_000);
    }

    #[test]
    fn a_clearly_faster_candidate_passes_and_an_equal_one_fails() {
        let r = decide(&policy(), &even(100), &even(50), &even(100));
        assert_eq!((r.verdict, r.code.as_str()), (Verdict::Pass, "speed.pass"));
        assert_eq!(
            (r.speedup_bp, r.noise_bp, r.required_bp),
            (20_000, 0, 10_500)
        );
        assert_eq!(r.baseline, Baseline::Bracketed);
        let r = decide(&policy(), &even(100), &even(100), &even(100));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::Fail, "speed.slower")
        );
    }

    #[test]
    fn noise_raises_the_bar_and_a_result_inside_the_bracket_is_not_proven() {
        // B′ 5 % faster than B: noise ≈ 512 bp, required = 1 + 3 × noise.
        let (b, b2) = (even(100), even(95));
        let r = decide(&policy(), &b, &even(50), &b2);
        assert_eq!(r.verdict, Verdict::Pass);
        assert!((510..=515).contains(&r.noise_bp), "{r:?}");
        assert_eq!(r.required_bp, 10_000 + 3 * r.noise_bp);
        // 1.2× B: above the bar against the slower baseline, below it against the faster.
        let c = read(&[], &[83, 83, 84, 83, 83, 84, 83, 84]);
        let r = decide(&policy(), &b, &c, &b2);
        assert!(
            r.low_bp < r.required_bp && r.high_bp >= r.required_bp,
            "{r:?}"
        );
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::Fail, "speed.not-proven")
        );
    }

    #[test]
    fn bracket_drift_drops_the_later_read_and_c_against_b_decides() {
        // B′ 40 % faster than B: drift. Against B alone C (1.43×) passes; against B′ it
        // would not.
        let r = decide(&policy(), &even(100), &even(70), &even(60));
        assert_eq!(r.baseline, Baseline::Drift);
        assert!(r.bracket_noise_bp > 1_000);
        assert_eq!(r.baseline_milli[0], r.baseline_milli[1]);
        assert_eq!((r.verdict, r.code.as_str()), (Verdict::Pass, "speed.pass"));
        // A drift never lowers the bar: B's halves agree exactly, yet the noise taken is the
        // bound, so 1.25× (enough against a steady bracket) is not enough after a drift.
        assert_eq!(r.noise_bp, 1_000);
        assert_eq!(r.required_bp, 10_000 + 3_000);
        let r = decide(&policy(), &even(100), &even(80), &even(60));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::Fail, "speed.slower")
        );
        assert_eq!(
            decide(&policy(), &even(100), &even(80), &even(100)).verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn a_baseline_the_host_could_not_keep_is_a_no_decision_never_a_fail() {
        // Drift, and B's own halves disagree: no baseline at all.
        let b = read(&[], &[100, 100, 100, 100, 80, 80, 80, 80]);
        let r = decide(&policy(), &b, &even(100), &even(60));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::NoDecision, "speed.noise")
        );
        // B's windows scatter beyond the bound.
        let b = read(&[], &[10, 100, 10, 100, 10, 100, 10, 100]);
        let r = decide(&policy(), &b, &even(10), &b);
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::NoDecision, "speed.baseline")
        );
        // B′'s windows scatter beyond the bound: not a drift, no second usable read.
        let scattered = read(&[], &[10, 100, 10, 100]);
        let r = decide(&policy(), &even(100), &even(10), &scattered);
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::NoDecision, "speed.baseline")
        );
        // A baseline too slow to register at all is no measurement.
        let crawl = read(&[], &[u64::MAX / MS / 16; 4]);
        let r = decide(&policy(), &crawl, &even(10), &crawl);
        assert_eq!(r.baseline_milli, [0, 0]);
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::NoDecision, "speed.baseline")
        );
        // Fewer timed windows than the policy asks.
        let r = decide(&policy(), &read(&[], &[100; 3]), &even(10), &even(100));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::NoDecision, "speed.plan")
        );
    }

    #[test]
    fn a_scattering_candidate_or_a_conditioning_regression_fails() {
        let c = read(&[], &[10, 100, 10, 100, 10, 100, 10, 100]);
        let r = decide(&policy(), &even(100), &c, &even(100));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::Fail, "speed.scatter")
        );
        // Twice as fast when timed, three times slower to condition.
        let b = read(&[100, 100], &[100; 8]);
        let c = read(&[300, 300], &[50; 8]);
        let r = decide(&policy(), &b, &c, &b);
        assert_eq!(r.c.conditioning_ns, Some(600 * MS));
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (Verdict::Fail, "speed.conditioning")
        );
        // Within the allowed slowdown it passes.
        let c = read(&[110, 110], &[50; 8]);
        assert_eq!(decide(&policy(), &b, &c, &b).verdict, Verdict::Pass);
    }

    #[test]
    fn the_record_round_trips_and_recomputes_to_itself() {
        let (b, c, b2) = (even(100), even(50), even(97));
        let r = decide(&policy(), &b, &c, &b2);
        let back: SpeedRecord = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(decide(&policy(), &b, &c, &b2), r);
    }
}
