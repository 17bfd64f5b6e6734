use super::*;

fn id(client: u64, seq: u64) -> PushId {
    PushId { client, seq }
}

fn pushed(rows: u64) -> Response {
    Response::Pushed {
        rows,
        rejected_nonfinite: 0,
    }
}

fn code(r: Result<Admission, Refusal>) -> ErrorCode {
    match r {
        Err(refusal) => match refusal.into_reply().header {
            Response::Error { code, .. } => code,
            other => panic!("{other:?}"),
        },
        Ok(a) => panic!("admitted: {a:?}"),
    }
}

#[test]
fn a_retry_gets_the_first_answer_and_a_running_copy_is_refused_transiently() {
    let w = PushWindow::new(PushWindowLimits::default());
    assert!(matches!(w.admit(id(7, 1)), Ok(Admission::Apply)));
    assert_eq!(code(w.admit(id(7, 1))), ErrorCode::InProgress);
    assert!(ErrorCode::InProgress.is_transient());
    w.finish(id(7, 1), Some(&pushed(3)));
    match w.admit(id(7, 1)) {
        Ok(Admission::Answer(a)) => assert_eq!(a, pushed(3)),
        other => panic!("{other:?}"),
    }
    // Another client's push of the same number is its own.
    assert!(matches!(w.admit(id(8, 1)), Ok(Admission::Apply)));
}

#[test]
fn a_push_refused_before_any_change_is_forgotten_and_its_retry_applied() {
    let w = PushWindow::new(PushWindowLimits::default());
    assert!(matches!(w.admit(id(7, 1)), Ok(Admission::Apply)));
    w.finish(id(7, 1), None);
    assert!(matches!(w.admit(id(7, 1)), Ok(Admission::Apply)));
}

#[test]
fn pushes_without_id_are_always_applied() {
    let w = PushWindow::new(PushWindowLimits::default());
    for _ in 0..3 {
        assert!(matches!(w.admit(PushId::NONE), Ok(Admission::Apply)));
        w.finish(PushId::NONE, Some(&pushed(1)));
    }
    assert_eq!(w.clients(), 0);
}

#[test]
fn the_window_is_bounded_and_never_reapplies_what_it_forgot() {
    let w = PushWindow::new(PushWindowLimits {
        clients: 2,
        per_client: 3,
    });
    for seq in 1..=5 {
        assert!(matches!(w.admit(id(7, seq)), Ok(Admission::Apply)));
        w.finish(id(7, seq), Some(&pushed(seq)));
    }
    // 1 and 2 were forgotten: a copy is refused (not applied, not transient); 3..=5 are answered.
    for seq in [1, 2] {
        let c = code(w.admit(id(7, seq)));
        assert_eq!(c, ErrorCode::BadRequest);
        assert!(!c.is_transient());
    }
    for seq in 3..=5 {
        assert!(matches!(w.admit(id(7, seq)), Ok(Admission::Answer(a)) if a == pushed(seq)));
    }
    // A running entry is never forgotten to make room.
    assert!(matches!(w.admit(id(7, 6)), Ok(Admission::Apply)));
    for seq in 7..=9 {
        assert!(matches!(w.admit(id(7, seq)), Ok(Admission::Apply)));
        w.finish(id(7, seq), Some(&pushed(seq)));
    }
    assert_eq!(code(w.admit(id(7, 6))), ErrorCode::InProgress);
    // Two clients at most: a third forgets the one idle longest (8 here, as 7 was just heard from).
    assert!(matches!(w.admit(id(8, 1)), Ok(Admission::Apply)));
    let _ = w.admit(id(7, 9));
    assert!(matches!(w.admit(id(9, 1)), Ok(Admission::Apply)));
    assert_eq!(w.clients(), 2);
    assert!(matches!(w.admit(id(7, 9)), Ok(Admission::Answer(_))));
}

#[test]
fn a_backup_remembers_the_answers_its_primary_streams() {
    let w = PushWindow::new(PushWindowLimits::default());
    w.remember(&[PushAnswer {
        id: id(7, 4),
        rows: 2,
        rejected_nonfinite: 1,
    }]);
    match w.admit(id(7, 4)) {
        Ok(Admission::Answer(Response::Pushed {
            rows: 2,
            rejected_nonfinite: 1,
        })) => {}
        other => panic!("{other:?}"),
    }
}
