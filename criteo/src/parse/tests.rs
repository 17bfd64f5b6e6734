//! Tests of the line parser: real Kaggle lines, every edge case of the format, every error message.

use super::*;

/// A complete line from the Kaggle set (day 0, line 1).
const KAGGLE: &str = "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t\
    25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t\
    8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t\
    9727dd16";

fn parse(line: &str) -> Result<(LineKind, Row), ParseError> {
    let mut row = Row::default();
    parse_line(line.as_bytes(), &mut row).map(|kind| (kind, row))
}

fn err(line: &str) -> String {
    parse(line).unwrap_err().to_string()
}

/// A line of `fields` fields: label 1, each integer its column number, each categorical `00000c0<col>`.
fn synthetic(fields: usize) -> String {
    let mut parts = vec!["1".to_string()];
    parts.extend((1..=NUM_DENSE).map(|i| i.to_string()));
    parts.extend((1..=NUM_SPARSE).map(|c| format!("{c:08x}")));
    parts.truncate(fields);
    parts.join("\t")
}

#[test]
fn full_kaggle_line() {
    let (kind, row) = parse(KAGGLE).unwrap();
    assert_eq!(kind, LineKind::Full);
    assert_eq!(row.label, 0.0);
    assert_eq!(row.dense[0], (2f64).ln() as f32);
    assert_eq!(row.dense[4], (1383f64).ln() as f32);
    assert_eq!(row.dense[11], 0.0, "I12 is empty");
    assert_eq!(row.sparse[0], Some(0x68fd1e64));
    assert_eq!(row.sparse[21], None, "C22 is empty");
    assert_eq!(row.sparse[25], Some(0x9727dd16));
}

#[test]
fn leading_and_trailing_tabs() {
    // Empty I1 (leading tab after the label) and empty C25, C26 (trailing tabs).
    let mut fields: Vec<String> = synthetic(NUM_FIELDS)
        .split('\t')
        .map(str::to_string)
        .collect();
    fields[1].clear();
    fields[38].clear();
    fields[39].clear();
    let (kind, row) = parse(&fields.join("\t")).unwrap();
    assert_eq!(kind, LineKind::Full);
    assert_eq!(row.dense[0], 0.0);
    assert_eq!(row.dense[1], (3f64).ln() as f32);
    assert_eq!(&row.sparse[23..], &[Some(24), None, None]);
}

#[test]
fn line_starting_with_a_tab_has_an_empty_label() {
    assert_eq!(
        err(&format!("\t{}", &synthetic(39)[2..])),
        r#"column label (field 1): "" is not 0 or 1"#
    );
}

#[test]
fn negative_and_extreme_integers() {
    let line = synthetic(NUM_FIELDS)
        .replacen("\t2\t", "\t-2\t", 1)
        .replacen("\t3\t", "\t-9223372036854775808\t", 1);
    let (_, row) = parse(&line).unwrap();
    assert_eq!(row.dense[1], 0.0);
    assert_eq!(row.dense[2], 0.0);
    assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_i64(b"9223372036854775808"), None);
    assert_eq!(parse_i64(b"-9223372036854775809"), None);
    assert_eq!(parse_i64(b"+7"), Some(7));
    assert_eq!(parse_i64(b"-"), None);
    assert_eq!(parse_i64(b"1.5"), None);
    assert_eq!(log1p_clamped(i64::MAX), (i64::MAX as f64).ln_1p() as f32);
}

#[test]
fn dense_values_match_ln_1p() {
    let xs = (0..3000).chain([1 << 20, 1 << 40, (1 << 53) - 1, 1 << 53, i64::MAX - 1]);
    for x in xs {
        assert_eq!(log1p_clamped(x), (x as f64).ln_1p() as f32, "x = {x}");
    }
    assert_eq!(log1p_clamped(-5), 0.0);
}

#[test]
fn stripped_trailing_fields_are_padded() {
    for fields in 1..NUM_FIELDS {
        let (kind, row) = parse(&synthetic(fields)).unwrap();
        assert_eq!(kind, LineKind::Padded { fields });
        let dense_present = fields.saturating_sub(1).min(NUM_DENSE);
        assert!(row.dense[..dense_present].iter().all(|&x| x > 0.0));
        assert!(row.dense[dense_present..].iter().all(|&x| x == 0.0));
        let sparse_present = fields.saturating_sub(1 + NUM_DENSE);
        assert!(row.sparse[..sparse_present].iter().all(Option::is_some));
        assert!(row.sparse[sparse_present..].iter().all(Option::is_none));
    }
}

#[test]
fn padding_overwrites_the_previous_row() {
    let mut row = Row::default();
    parse_line(synthetic(NUM_FIELDS).as_bytes(), &mut row).unwrap();
    parse_line(b"0", &mut row).unwrap();
    assert_eq!(row, Row::default());
}

#[test]
fn line_cut_mid_categorical_still_parses() {
    let (kind, row) = parse(&KAGGLE[..KAGGLE.find("68fd1e64").unwrap() + 7]).unwrap();
    assert_eq!(kind, LineKind::Padded { fields: 15 });
    assert_eq!(row.sparse[0], Some(0x68fd1e6));
}

#[test]
fn line_cut_and_joined_with_garbage_is_an_error() {
    let line = format!(
        "{}\u{0}\u{0}PK\u{3}",
        &KAGGLE[..KAGGLE.find("68fd1e64").unwrap() + 7]
    );
    assert_eq!(
        err(&line),
        "column C1 (field 15): \"68fd1e6\\0\\0PK\\u{3}\" is not hex"
    );
}

#[test]
fn non_hex_categorical_names_the_column() {
    let line = synthetic(NUM_FIELDS).replace("00000005", "zzzz1234");
    assert_eq!(err(&line), r#"column C5 (field 19): "zzzz1234" is not hex"#);
    let line = synthetic(NUM_FIELDS).replace("00000005", "0000000ab");
    assert_eq!(
        err(&line),
        r#"column C5 (field 19): "0000000ab" has more than 8 hex digits"#
    );
    let line = synthetic(NUM_FIELDS).replace("00000005", "0000000zz");
    assert_eq!(
        err(&line),
        r#"column C5 (field 19): "0000000zz" is not hex"#
    );
}

#[test]
fn hex_accepts_both_cases_and_short_tokens() {
    assert_eq!(parse_hex(b"ABCDEF01"), Ok(Some(0xabcdef01)));
    assert_eq!(parse_hex(b"abcdef01"), Ok(Some(0xabcdef01)));
    assert_eq!(parse_hex(b"f"), Ok(Some(0xf)));
    assert_eq!(parse_hex(b"FfFfFfFf"), Ok(Some(u32::MAX)));
    assert_eq!(parse_hex(b""), Ok(None));
    assert_eq!(parse_hex(b"g"), Err(false));
    assert_eq!(parse_hex(b" 1"), Err(false));
    assert_eq!(parse_hex(b"0x12"), Err(false));
}

#[test]
fn bad_integer_names_the_column() {
    let line = synthetic(NUM_FIELDS).replacen("\t4\t", "\t4.5\t", 1);
    assert_eq!(
        err(&line),
        r#"column I4 (field 5): "4.5" is not a 64-bit integer"#
    );
}

#[test]
fn too_many_fields() {
    assert_eq!(
        err(&format!("{}\t", synthetic(NUM_FIELDS))),
        "41 fields, expected at most 40"
    );
    assert_eq!(
        err(&format!("{}\tx\ty", synthetic(NUM_FIELDS))),
        "42 fields, expected at most 40"
    );
}

#[test]
fn bad_labels() {
    for label in ["2", "-1", "", "00", "1.0", "yes"] {
        let line = format!("{label}{}", &synthetic(NUM_FIELDS)[1..]);
        assert_eq!(
            err(&line),
            format!("column label (field 1): {label:?} is not 0 or 1")
        );
    }
}

#[test]
fn crlf_and_newline_are_stripped() {
    let (kind, row) = parse(&format!("{KAGGLE}\r\n")).unwrap();
    assert_eq!(kind, LineKind::Full);
    assert_eq!(row.sparse[25], Some(0x9727dd16));
    assert_eq!(parse(&format!("{KAGGLE}\r")).unwrap().1, row);
    assert_eq!(parse("1\r").unwrap().0, LineKind::Padded { fields: 1 });
}

#[test]
fn empty_lines() {
    for line in ["", "\n", "\r\n", "\r"] {
        assert_eq!(parse(line).unwrap().0, LineKind::Empty);
    }
}

#[test]
fn csv_header_is_detected() {
    let header = b"Id,Label,I1,I2,I3,I4,I5,I6,I7,I8,I9,I10,I11,I12,I13,C1,C2";
    assert_eq!(TextFormat::detect(header), TextFormat::Csv);
    assert_eq!(TextFormat::detect(b"Id,Label\r"), TextFormat::Csv);
    assert_eq!(TextFormat::detect(KAGGLE.as_bytes()), TextFormat::Tsv);
    assert_eq!(TextFormat::detect(b""), TextFormat::Tsv);
    assert_eq!(TextFormat::detect(b"id,label"), TextFormat::Tsv);
}

#[test]
fn csv_line_parses_like_its_tsv_line() {
    let csv = format!("10000743,{}", KAGGLE.replace('\t', ","));
    let mut row = Row::default();
    let kind = parse_csv_line(csv.as_bytes(), &mut row).unwrap();
    assert_eq!((kind, row.clone()), parse(KAGGLE).unwrap());
    let crlf = format!("{csv}\r\n");
    assert_eq!(TextFormat::Csv.parse(crlf.as_bytes(), &mut row), Ok(kind));
    // Padded and empty lines, as in TSV.
    assert_eq!(
        parse_csv_line(b"7,1,2,3", &mut row),
        Ok(LineKind::Padded { fields: 3 })
    );
    assert_eq!(row.dense[1], (4f64).ln() as f32);
    assert_eq!(parse_csv_line(b"\r\n", &mut row), Ok(LineKind::Empty));
}

#[test]
fn bad_csv_lines_name_the_column() {
    let mut row = Row::default();
    let bad_int =
        format!("1,{}", synthetic(NUM_FIELDS).replace('\t', ",")).replacen(",4,", ",4.5,", 1);
    assert_eq!(
        parse_csv_line(bad_int.as_bytes(), &mut row)
            .unwrap_err()
            .to_string(),
        r#"column I4 (field 5): "4.5" is not a 64-bit integer"#
    );
    for line in ["12345", "12345,", "12345,,1"] {
        assert_eq!(
            parse_csv_line(line.as_bytes(), &mut row),
            Err(ParseError::BadLabel {
                text: String::new()
            }),
            "{line}"
        );
    }
    // A tab-separated line is one long label to the CSV parser.
    assert!(matches!(
        parse_csv_line(KAGGLE.as_bytes(), &mut row),
        Err(ParseError::BadLabel { .. })
    ));
}

#[test]
fn long_garbage_is_cut_in_the_message() {
    let msg = err(&"x".repeat(10_000));
    assert!(msg.len() < 120, "{msg}");
    assert!(msg.contains("...\""), "{msg}");
}

/// [`synthetic`] with C3 (field 17) replaced by `c3`.
fn with_c3(c3: &str) -> String {
    let mut fields: Vec<String> = synthetic(NUM_FIELDS)
        .split('\t')
        .map(str::to_string)
        .collect();
    fields[16] = c3.to_string();
    fields.join("\t")
}

#[test]
fn token_lists() {
    let (kind, row) = parse(&with_c3("68fd1e64|80e26c9b|Fb9")).unwrap();
    assert_eq!(kind, LineKind::Full);
    assert_eq!(row.tokens(2), [0x68fd1e64, 0x80e26c9b, 0xfb9]);
    assert_eq!(row.sparse[2], Some(0x68fd1e64), "the first token");
    assert_eq!(row.extra_tokens(), 2);
    // The other columns are one token each.
    assert_eq!(row.tokens(0), [1]);
    assert_eq!(row.tokens(25), [26]);
    // One token, and an empty field.
    let (_, row) = parse(&with_c3("7")).unwrap();
    assert_eq!((row.tokens(2), row.extra_tokens()), (&[7][..], 0));
    let (_, row) = parse(&with_c3("")).unwrap();
    assert_eq!((row.tokens(2), row.sparse[2]), (&[][..], None));
    // Many tokens: the parser keeps them all, the layout truncates.
    let many: Vec<String> = (0..300).map(|t| format!("{t:x}")).collect();
    let (_, row) = parse(&with_c3(&many.join("|"))).unwrap();
    assert_eq!(row.tokens(2), (0..300).collect::<Vec<u32>>());
    assert_eq!(row.extra_tokens(), 299);
}

#[test]
fn a_row_reused_forgets_the_last_lines_lists() {
    let mut row = Row::default();
    parse_line(with_c3("1|2|3").as_bytes(), &mut row).unwrap();
    let capacity = row.more.capacity();
    parse_line(with_c3("4").as_bytes(), &mut row).unwrap();
    assert_eq!((row.tokens(2), row.extra_tokens()), (&[4][..], 0));
    parse_line(with_c3("5|6").as_bytes(), &mut row).unwrap();
    assert_eq!(row.tokens(2), [5, 6]);
    assert_eq!(row.more.capacity(), capacity, "the buffer is reused");
    // A bad list leaves nothing behind for the next line.
    assert!(parse_line(with_c3("5||6").as_bytes(), &mut row).is_err());
    parse_line(synthetic(NUM_FIELDS).as_bytes(), &mut row).unwrap();
    assert_eq!((row.tokens(2), row.extra_tokens()), (&[3][..], 0));
}

#[test]
fn bad_token_lists_name_the_column_and_token() {
    for list in ["a||b", "a|", "|a", "|", "||"] {
        assert_eq!(
            err(&with_c3(list)),
            format!("column C3 (field 17): {list:?} has an empty token between or beside `|`")
        );
    }
    assert_eq!(
        err(&with_c3("a|xyz|b")),
        r#"column C3 (field 17): "xyz" is not hex"#
    );
    assert_eq!(
        err(&with_c3("a|123456789")),
        r#"column C3 (field 17): "123456789" has more than 8 hex digits"#
    );
    // In CSV too.
    let csv = format!("9,{}", with_c3("1|g").replace('\t', ","));
    let mut row = Row::default();
    assert_eq!(
        parse_csv_line(csv.as_bytes(), &mut row)
            .unwrap_err()
            .to_string(),
        r#"column C3 (field 17): "g" is not hex"#
    );
}

#[test]
fn set_tokens_is_what_parsing_gives() {
    let (_, parsed) = parse(&with_c3("a|b|c")).unwrap();
    let (_, mut built) = parse(&with_c3("")).unwrap();
    built.set_tokens(2, &[1, 2]);
    built.set_tokens(2, &[0xa, 0xb, 0xc]);
    assert_eq!(built.tokens(2), parsed.tokens(2));
    assert_eq!(built.extra_tokens(), 2);
    built.set_tokens(2, &[]);
    assert_eq!(
        (built.tokens(2), built.sparse[2], built.extra_tokens()),
        (&[][..], None, 0)
    );
}

proptest::proptest! {
    /// Any list of 1-8 digit tokens parses back to its values.
    #[test]
    fn lists_round_trip(tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..20)) {
        let text: Vec<String> = tokens.iter().map(|t| format!("{t:x}")).collect();
        let (_, row) = parse(&with_c3(&text.join("|"))).unwrap();
        proptest::prop_assert_eq!(row.tokens(2), &tokens[..]);
        proptest::prop_assert_eq!(row.extra_tokens() as usize, tokens.len() - 1);
    }
}

#[test]
fn unlabeled_lines_parse_like_labeled_ones() {
    let labeled = synthetic(NUM_FIELDS).replacen('1', "0", 1);
    let unlabeled = labeled.split_once('\t').unwrap().1.to_owned();
    let (mut a, mut b) = (Row::default(), Row::default());
    assert_eq!(
        parse_line(labeled.as_bytes(), &mut a).unwrap(),
        LineKind::Full
    );
    assert_eq!(
        parse_unlabeled_line(unlabeled.as_bytes(), &mut b).unwrap(),
        LineKind::Full
    );
    assert_eq!(a, b);
    // Stripped trailing fields are missing values; an empty line is empty.
    let short: Vec<&str> = unlabeled.split('\t').take(20).collect();
    assert_eq!(
        parse_unlabeled_line(short.join("\t").as_bytes(), &mut b).unwrap(),
        LineKind::Padded { fields: 20 }
    );
    assert_eq!(
        parse_unlabeled_line(b"\n", &mut b).unwrap(),
        LineKind::Empty
    );
    // Errors count I1 as field 1.
    let bad = unlabeled.replacen("\t4\t", "\tx\t", 1);
    let e = parse_unlabeled_line(bad.as_bytes(), &mut b).unwrap_err();
    assert!(e.to_string().starts_with("column I"), "{e}");
    let e = parse_unlabeled_line(labeled.as_bytes(), &mut b).unwrap_err();
    assert_eq!(e, ParseError::TooManyUnlabeledFields { fields: 40 });
    let hex = unlabeled.replacen("00000005", "zz", 1);
    let e = parse_unlabeled_line(hex.as_bytes(), &mut b).unwrap_err();
    assert!(
        matches!(e, ParseError::NotHex { column, field, .. } if field == column + 13),
        "{e:?}"
    );
}
