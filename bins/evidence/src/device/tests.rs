use super::*;

use crate::examples::{device_config as pinned_config, idle_sample};

#[test]
fn every_field_of_the_pinned_configuration_is_compared() {
    let pinned = pinned_config();
    assert_eq!(drift(&pinned, &pinned), Vec::<String>::new());
    type Change = fn(&mut DeviceConfig);
    let changes: [(&str, Change); 10] = [
        ("driver 560.1, not 550.54.15", |c| {
            "560.1".clone_into(&mut c.driver)
        }),
        ("persistence false, not true", |c| c.persistence = false),
        ("compute mode Default, not ExclusiveProcess", |c| {
            c.compute_mode = ComputeMode::Default;
        }),
        (
            "application clocks (1410, 2619) MHz, not (1980, 2619)",
            |c| {
                c.application_clocks.0 = 1410;
            },
        ),
        (
            "application clocks (1980, 1593) MHz, not (1980, 2619)",
            |c| {
                c.application_clocks.1 = 1593;
            },
        ),
        ("power limit 350000 mW, not 700000", |c| {
            c.power_limit_mw = 350_000
        }),
        (
            "ECC (now, after reset) (false, true), not (true, true)",
            |c| {
                c.ecc.0 = false;
            },
        ),
        (
            "ECC (now, after reset) (true, false), not (true, true)",
            |c| {
                c.ecc.1 = false;
            },
        ),
        (
            "MIG (now, after reset) (true, false), not (false, false)",
            |c| {
                c.mig.0 = true;
            },
        ),
        (
            "MIG (now, after reset) (false, true), not (false, false)",
            |c| {
                c.mig.1 = true;
            },
        ),
    ];
    for (what, change) in changes {
        let mut seen = pinned.clone();
        change(&mut seen);
        assert_eq!(drift(&pinned, &seen), [what]);
    }
}

#[test]
fn the_active_sample_must_be_inside_the_envelope() {
    let envelope = Envelope {
        max_temperature_c: 85,
        max_power_mw: 700_000,
        min_graphics_mhz: 1700,
        forbidden_throttle: 0x8 | 0x20 | 0x40 | 0x80,
    };
    let working = |edit: fn(&mut Sample)| {
        let mut s = idle_sample();
        s.utilisation = 100;
        s.throttle = 0x2;
        edit(&mut s);
        envelope.breaches(&s)
    };
    assert_eq!(working(|_| {}), Vec::<String>::new());
    // At each bound exactly: inside.
    assert_eq!(
        working(|s| {
            s.temperature_c = 85;
            s.power_mw = 700_000;
            s.clocks.0 = 1700;
        }),
        Vec::<String>::new()
    );
    type Breach = fn(&mut Sample);
    let breaches: [(&str, Breach); 7] = [
        ("temperature 86 °C, above 85", |s| s.temperature_c = 86),
        ("power 700001 mW, above 700000", |s| s.power_mw = 700_001),
        ("graphics clock 1699 MHz, below 1700", |s| s.clocks.0 = 1699),
        ("throttled: hw-slowdown, hw-thermal-slowdown", |s| {
            s.throttle |= 0x8 | 0x40 | 0x4;
        }),
        ("throttled: hw-power-brake-slowdown", |s| s.throttle |= 0x80),
        ("Xid events [48]", |s| s.xid = vec![48]),
        ("memory pending retirement or remapping", |s| {
            s.retirement_pending = true;
        }),
    ];
    for (what, breach) in breaches {
        assert_eq!(working(breach), [what]);
    }
}

#[test]
fn throttle_bits_are_named_and_an_unnamed_one_is_shown() {
    assert_eq!(throttle_names(0), Vec::<String>::new());
    assert_eq!(
        throttle_names(0x1 | 0x100 | 0x400),
        ["gpu-idle", "display-clock-setting", "0x400"]
    );
}
