use std::time::{Duration, Instant};

use proptest::prelude::*;
use protocol::wire::message::reduce::ReduceHeader;

use super::*;

fn h(step: u64, rank: u32, world: u32, samples: u64) -> ReduceHeader {
    ReduceHeader {
        group: 1,
        step,
        rank,
        world,
        samples,
        done: false,
        timeout_ms: 1000,
        len: 2,
        encoding: protocol::Encoding::F32,
    }
}

fn ready(c: Contribution) -> Arc<Outcome> {
    match c {
        Contribution::Ready(o) => o,
        Contribution::Wait { .. } => panic!("expected the step finalized"),
    }
}

fn waits(c: Contribution) -> (watch::Receiver<Option<Arc<Outcome>>>, Instant) {
    match c {
        Contribution::Wait { rx, deadline } => (rx, deadline),
        Contribution::Ready(_) => panic!("expected a wait"),
    }
}

#[test]
fn the_last_rank_finalizes_and_wakes_the_others() {
    let r = Reducer::default();
    let t = Instant::now();
    let (rx, _) = waits(r.contribute(&h(0, 0, 2, 10), vec![1.0, 2.0], t).unwrap());
    let o = ready(r.contribute(&h(0, 1, 2, 30), vec![0.5, -1.0], t).unwrap());
    assert_eq!(o.sum, [1.5, 1.0]);
    assert_eq!((o.header.samples, o.header.contributors), (40, 2));
    assert!(o.header.missing.is_empty() && !o.header.all_done);
    let woken = rx.borrow().clone().expect("the waiter sees the outcome");
    assert!(Arc::ptr_eq(&woken, &o));
}

#[test]
fn a_retried_contribution_is_not_added_twice() {
    let r = Reducer::default();
    let t = Instant::now();
    waits(r.contribute(&h(0, 0, 2, 10), vec![1.0, 2.0], t).unwrap());
    waits(r.contribute(&h(0, 0, 2, 10), vec![1.0, 2.0], t).unwrap());
    let o = ready(r.contribute(&h(0, 1, 2, 10), vec![1.0, 1.0], t).unwrap());
    assert_eq!((o.sum.as_slice(), o.header.samples), (&[2.0, 3.0][..], 20));
    // After finalization, a retry gets the same answer.
    let again = ready(r.contribute(&h(0, 0, 2, 10), vec![9.0, 9.0], t).unwrap());
    assert!(Arc::ptr_eq(&again, &o));
}

#[test]
fn the_deadline_finalizes_without_the_missing_rank_which_is_not_waited_for_again() {
    let r = Reducer::default();
    let t = Instant::now();
    let (_, deadline) = waits(r.contribute(&h(0, 0, 3, 1), vec![1.0, 1.0], t).unwrap());
    waits(r.contribute(&h(0, 1, 3, 1), vec![1.0, 1.0], t).unwrap());
    assert!(r.expire(1, 0, t).is_none(), "not before the deadline");
    let o = r.expire(1, 0, deadline).unwrap();
    assert_eq!(o.header.missing, [2]);
    assert_eq!(o.header.contributors, 2);
    // Step 1: ranks 0 and 1 suffice.
    waits(r.contribute(&h(1, 0, 3, 1), vec![1.0, 1.0], t).unwrap());
    let o1 = ready(r.contribute(&h(1, 1, 3, 1), vec![1.0, 1.0], t).unwrap());
    assert_eq!(o1.header.missing, [2]);
    // The late rank gets step 0's answer, listed as missing, and is waited for again from then on.
    let late = ready(r.contribute(&h(0, 2, 3, 1), vec![5.0, 5.0], t).unwrap());
    assert!(Arc::ptr_eq(&late, &o));
    waits(r.contribute(&h(2, 0, 3, 1), vec![1.0, 1.0], t).unwrap());
    waits(r.contribute(&h(2, 1, 3, 1), vec![1.0, 1.0], t).unwrap());
    let o2 = ready(r.contribute(&h(2, 2, 3, 1), vec![1.0, 1.0], t).unwrap());
    assert!(o2.header.missing.is_empty());
}

#[test]
fn all_done_only_when_every_contributor_is_done() {
    let r = Reducer::default();
    let t = Instant::now();
    let done = |step, rank| ReduceHeader {
        done: true,
        ..h(step, rank, 2, 0)
    };
    waits(r.contribute(&done(0, 0), vec![0.0, 0.0], t).unwrap());
    assert!(
        !ready(r.contribute(&h(0, 1, 2, 5), vec![1.0, 1.0], t).unwrap())
            .header
            .all_done
    );
    waits(r.contribute(&done(1, 0), vec![0.0, 0.0], t).unwrap());
    assert!(
        ready(r.contribute(&done(1, 1), vec![0.0, 0.0], t).unwrap())
            .header
            .all_done
    );
}

#[test]
fn bad_contributions_are_refused_by_name() {
    let r = Reducer::default();
    let t = Instant::now();
    waits(r.contribute(&h(0, 0, 2, 1), vec![1.0, 1.0], t).unwrap());
    let e = r
        .contribute(&h(0, 1, 3, 1), vec![1.0, 1.0], t)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("world 2, this contribution says 3"),
        "{e}"
    );
    let e = r.contribute(&h(0, 1, 2, 1), vec![1.0], t).err().unwrap();
    assert!(e.to_string().contains("1 values"), "{e}");
    let e = r
        .contribute(&h(0, 1, 2, 1), vec![1.0, f32::NAN], t)
        .err()
        .unwrap();
    assert!(e.to_string().contains("value 1 is NaN"), "{e}");
    for step in 1..=KEEP_STEPS + 2 {
        waits(r.contribute(&h(step, 0, 2, 1), vec![1.0, 1.0], t).unwrap());
        ready(r.contribute(&h(step, 1, 2, 1), vec![1.0, 1.0], t).unwrap());
    }
    let e = r
        .contribute(&h(0, 1, 2, 1), vec![1.0, 1.0], t)
        .err()
        .unwrap();
    assert!(matches!(e, ReduceError::TooOld { step: 0, .. }), "{e}");
}

#[test]
fn idle_groups_are_dropped() {
    let r = Reducer::default();
    let t = Instant::now();
    waits(r.contribute(&h(0, 0, 2, 1), vec![1.0, 1.0], t).unwrap());
    let other = ReduceHeader {
        group: 2,
        ..h(0, 0, 2, 1)
    };
    waits(
        r.contribute(
            &other,
            vec![1.0, 1.0],
            t + IDLE_GROUP + Duration::from_secs(1),
        )
        .unwrap(),
    );
    assert_eq!(r.groups(), 1);
}

proptest! {
    /// Any order of contributions (with retries) of `world` ranks sums like a plain loop over the ranks.
    #[test]
    fn sums_match_a_model(
        world in 1u32..5,
        values in prop::collection::vec(prop::collection::vec(-1e3f32..1e3, 3), 5),
        order in prop::collection::vec(0u32..5, 1..20),
    ) {
        let r = Reducer::default();
        let t = Instant::now();
        let mut sent = std::collections::BTreeSet::new();
        let mut outcome = None;
        let header = |rank: u32| ReduceHeader { len: 3, ..h(0, rank, world, rank as u64 + 1) };
        for rank in order.into_iter().chain(0..world).filter(|&r| r < world) {
            sent.insert(rank);
            match r.contribute(&header(rank), values[rank as usize].clone(), t).unwrap() {
                Contribution::Ready(o) => { outcome.get_or_insert(o); }
                Contribution::Wait { .. } => prop_assert!(sent.len() < world as usize),
            }
        }
        let o = outcome.unwrap();
        for (i, got) in o.sum.iter().enumerate() {
            let want: f32 = values.iter().take(world as usize).map(|v| v[i]).sum();
            prop_assert!((got - want).abs() <= 1e-3 * (1.0 + want.abs()));
        }
        prop_assert_eq!(o.header.samples, (1..=world as u64).sum::<u64>());
    }
}

#[test]
fn groups_past_the_limit_are_refused_until_one_goes_idle() {
    let r = Reducer::new(ReduceLimits {
        max_groups: 2,
        max_bytes: 1 << 20,
    });
    let t = Instant::now();
    let in_group = |group| ReduceHeader {
        group,
        ..h(0, 0, 2, 1)
    };
    waits(r.contribute(&in_group(1), vec![1.0, 1.0], t).unwrap());
    waits(r.contribute(&in_group(2), vec![1.0, 1.0], t).unwrap());
    let err = r
        .contribute(&in_group(3), vec![1.0, 1.0], t)
        .err()
        .expect("a third group is refused");
    assert_eq!(err, ReduceError::TooManyGroups { group: 3, max: 2 });
    assert!(err.to_string().contains("reduce group 3"), "{err}");
    // Known groups go on; once the others are idle, a new one fits.
    waits(r.contribute(&in_group(1), vec![1.0, 1.0], t).unwrap());
    let later = t + IDLE_GROUP + Duration::from_secs(1);
    waits(r.contribute(&in_group(3), vec![1.0, 1.0], later).unwrap());
    assert_eq!(r.groups(), 1);
}

#[test]
fn bytes_past_the_limit_drop_finalized_steps_first_then_refuse() {
    // Room for 3 open steps of 2 values (8 bytes each), or fewer with finalized ones.
    let r = Reducer::new(ReduceLimits {
        max_groups: 8,
        max_bytes: 24,
    });
    let t = Instant::now();
    // Step 0 of a world of 1 is finalized at once and kept for retries (8 bytes of sum, 8 once encoded).
    let done = ready(r.contribute(&h(0, 0, 1, 1), vec![1.0, 2.0], t).unwrap());
    let _ = done.encoded(protocol::Encoding::F32);
    assert_eq!(r.bytes(), 16);
    // Two open steps of another group (world 2, nobody else contributes).
    let other = |step| ReduceHeader {
        group: 2,
        ..h(step, 0, 2, 1)
    };
    waits(r.contribute(&other(0), vec![1.0, 1.0], t).unwrap());
    assert_eq!(r.bytes(), 24);
    // The next open step needs 8 more: group 1's finalized step 0 is dropped to make room.
    waits(r.contribute(&other(1), vec![1.0, 1.0], t).unwrap());
    assert_eq!(r.bytes(), 16);
    // A retry of the dropped step gets TooOld, never a wrong sum.
    assert_eq!(
        r.contribute(&h(0, 0, 1, 1), vec![1.0, 2.0], t).err(),
        Some(ReduceError::TooOld {
            group: 1,
            step: 0,
            oldest: 1
        })
    );
    waits(r.contribute(&other(2), vec![1.0, 1.0], t).unwrap());
    // Nothing finalized is left to drop: one more open step is refused, naming the numbers.
    let err = r.contribute(&other(3), vec![1.0, 1.0], t).err().unwrap();
    assert_eq!(
        err,
        ReduceError::Full {
            group: 2,
            step: 3,
            need: 8,
            held: 24,
            max: 24
        }
    );
    assert!(err.to_string().contains("max-reduce-bytes"), "{err}");
    // A contribution to a step already open needs nothing new.
    let o = ready(
        r.contribute(
            &ReduceHeader {
                group: 2,
                ..h(2, 1, 2, 1)
            },
            vec![1.0, 1.0],
            t,
        )
        .unwrap(),
    );
    assert_eq!(o.sum, [2.0, 2.0]);
}
