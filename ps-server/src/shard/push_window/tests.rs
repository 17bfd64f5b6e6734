use super::*;

/// The shape of every push of these tests but where one differs.
const SHAPE: u64 = 5;

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
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Apply)));
    assert_eq!(code(w.admit(id(7, 1), SHAPE)), ErrorCode::InProgress);
    assert!(ErrorCode::InProgress.is_transient());
    w.finish(id(7, 1), Some(&pushed(3)));
    match w.admit(id(7, 1), SHAPE) {
        Ok(Admission::Answer(a)) => assert_eq!(a, pushed(3)),
        other => panic!("{other:?}"),
    }
    // Another client's push of the same number is its own.
    assert!(matches!(w.admit(id(8, 1), SHAPE), Ok(Admission::Apply)));
}

#[test]
fn a_push_refused_before_any_change_is_forgotten_and_its_retry_applied() {
    let w = PushWindow::new(PushWindowLimits::default());
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Apply)));
    w.finish(id(7, 1), None);
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Apply)));
}

#[test]
fn pushes_without_id_are_always_applied() {
    let w = PushWindow::new(PushWindowLimits::default());
    for _ in 0..3 {
        assert!(matches!(w.admit(PushId::NONE, SHAPE), Ok(Admission::Apply)));
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
        assert!(matches!(w.admit(id(7, seq), SHAPE), Ok(Admission::Apply)));
        w.finish(id(7, seq), Some(&pushed(seq)));
    }
    // 1 and 2 were forgotten: a copy is refused (not applied, not transient); 3..=5 are answered.
    for seq in [1, 2] {
        let c = code(w.admit(id(7, seq), SHAPE));
        assert_eq!(c, ErrorCode::BadRequest);
        assert!(!c.is_transient());
    }
    for seq in 3..=5 {
        assert!(matches!(w.admit(id(7, seq), SHAPE), Ok(Admission::Answer(a)) if a == pushed(seq)));
    }
    // A running entry is never forgotten to make room.
    assert!(matches!(w.admit(id(7, 6), SHAPE), Ok(Admission::Apply)));
    for seq in 7..=9 {
        assert!(matches!(w.admit(id(7, seq), SHAPE), Ok(Admission::Apply)));
        w.finish(id(7, seq), Some(&pushed(seq)));
    }
    assert_eq!(code(w.admit(id(7, 6), SHAPE)), ErrorCode::InProgress);
    // Two clients at most: a third forgets the one idle longest (8 here, as 7 was just heard from).
    assert!(matches!(w.admit(id(8, 1), SHAPE), Ok(Admission::Apply)));
    let _ = w.admit(id(7, 9), SHAPE);
    assert!(matches!(w.admit(id(9, 1), SHAPE), Ok(Admission::Apply)));
    assert_eq!(w.clients(), 2);
    assert!(matches!(w.admit(id(7, 9), SHAPE), Ok(Admission::Answer(_))));
}

#[test]
fn a_backup_remembers_the_answers_its_primary_streams() {
    let w = PushWindow::new(PushWindowLimits::default());
    w.remember(&[PushAnswer {
        id: id(7, 4),
        rows: 2,
        rejected_nonfinite: 1,
    }]);
    match w.admit(id(7, 4), SHAPE) {
        Ok(Admission::Answer(Response::Pushed {
            rows: 2,
            rejected_nonfinite: 1,
        })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_durable_window_stores_answers_and_reads_them_back_within_its_bounds() {
    use embedding::{MemStore, Store};
    let store = MemStore::new();
    let limits = PushWindowLimits {
        clients: 2,
        per_client: 4,
    };
    let put = |w: &PushWindow, id: PushId, rows: u64| {
        assert!(matches!(w.admit(id, SHAPE), Ok(Admission::Apply)));
        let meta = w.durable_writes(id, SHAPE, rows, 1);
        store.write_tables(&[], &meta, true).unwrap();
        w.finish(
            id,
            Some(&Response::Pushed {
                rows,
                rejected_nonfinite: 1,
            }),
        );
    };
    let w = PushWindow::durable(limits, &store).unwrap();
    for seq in 0..6 {
        put(&w, id(1, seq), 10 + seq);
    }
    put(&w, id(2, 0), 20);
    // Slots: seq mod 4, so client 1 holds seqs 2..6 on disk.
    assert_eq!(store.list_meta(DURABLE_PREFIX).unwrap().len(), 5);
    // A window that is not durable writes nothing.
    assert!(PushWindow::new(limits)
        .durable_writes(id(1, 9), SHAPE, 1, 0)
        .is_empty());
    // No id: only the deletions owed.
    assert!(w.durable_writes(PushId::NONE, SHAPE, 1, 0).is_empty());

    // Restarted: the answers come back.
    let w = PushWindow::durable(limits, &store).unwrap();
    for (who, rows) in [(id(1, 5), 15), (id(1, 2), 12), (id(2, 0), 20)] {
        match w.admit(who, SHAPE) {
            Ok(Admission::Answer(a)) => assert_eq!(
                a,
                Response::Pushed {
                    rows,
                    rejected_nonfinite: 1
                }
            ),
            other => panic!("{who:?}: {other:?}"),
        }
    }
    // A push never stored is applied.
    assert!(matches!(w.admit(id(1, 6), SHAPE), Ok(Admission::Apply)));
    w.finish(id(1, 6), None);
    // A third client makes room by forgetting the idle one (client 2): its answers are deleted with the next
    // write.
    let _ = w.admit(id(1, 7), SHAPE);
    put(&w, id(3, 0), 30);
    let keys: Vec<String> = store
        .list_meta(DURABLE_PREFIX)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(
        keys.iter().all(|k| !k.contains(&format!("{:016x}", 2))),
        "{keys:?}"
    );
    assert_eq!(keys.len(), 5, "{keys:?}");

    // Unreadable entries are dropped (and deleted), not fatal.
    store.put_meta("push/zz/1", b"x").unwrap();
    store.put_meta(&durable_key(4, 0, 4), b"short").unwrap();
    let w = PushWindow::durable(limits, &store).unwrap();
    store
        .write_tables(&[], &w.durable_writes(PushId::NONE, SHAPE, 0, 0), true)
        .unwrap();
    assert_eq!(store.list_meta(DURABLE_PREFIX).unwrap().len(), 5);
}

#[test]
fn a_copy_of_another_shape_is_refused_not_answered() {
    let w = PushWindow::new(PushWindowLimits::default());
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Apply)));
    let refused = |r: Result<Admission, Refusal>| match r {
        Err(refusal) => match refusal.into_reply().header {
            Response::Error { code, message } => (code, message),
            other => panic!("{other:?}"),
        },
        Ok(a) => panic!("admitted: {a:?}"),
    };
    let (code, message) = refused(w.admit(id(7, 1), SHAPE + 2));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        message.contains("push 1 of client 0x7 reuses the id"),
        "{message}"
    );
    w.finish(id(7, 1), Some(&pushed(3)));
    assert_eq!(
        refused(w.admit(id(7, 1), SHAPE + 2)).0,
        ErrorCode::BadRequest
    );
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Answer(_))));
    // Answers learnt from a primary carry no shape: any copy gets them.
    w.remember(&[PushAnswer {
        id: id(7, 2),
        rows: 1,
        rejected_nonfinite: 0,
    }]);
    assert!(matches!(
        w.admit(id(7, 2), SHAPE + 2),
        Ok(Admission::Answer(_))
    ));
    assert_ne!(
        push_shape(protocol::Encoding::F32, &[], 8),
        push_shape(protocol::Encoding::F32, &[], 9)
    );
}

#[test]
fn an_unwritten_push_is_handed_to_one_retry_at_a_time_until_written() {
    let w = PushWindow::new(PushWindowLimits::default());
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Apply)));
    let unwritten = Box::new(Unwritten {
        answer: pushed(2),
        tables: Vec::new(),
        ids: vec![4, 5],
        held: None,
    });
    let storage = Response::Error {
        code: ErrorCode::Storage,
        message: "disk full".into(),
    };
    w.keep_unwritten(id(7, 1), unwritten, &storage);
    let Ok(Admission::Write(u)) = w.admit(id(7, 1), SHAPE) else {
        panic!("the retry writes it")
    };
    assert_eq!(u.ids, vec![4, 5]);
    // A second retry while the first writes.
    assert_eq!(code(w.admit(id(7, 1), SHAPE)), ErrorCode::InProgress);
    // The write failed again: the next retry gets it back.
    w.keep_unwritten(id(7, 1), u, &storage);
    let Ok(Admission::Write(u)) = w.admit(id(7, 1), SHAPE) else {
        panic!("the retry writes it")
    };
    w.finish(id(7, 1), Some(&u.answer));
    assert!(matches!(w.admit(id(7, 1), SHAPE), Ok(Admission::Answer(a)) if a == pushed(2)));
    assert_eq!(w.inner.lock().unwritten_ids, 0);
}
