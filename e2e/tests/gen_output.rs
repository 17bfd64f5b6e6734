//! Properties of generated files, checked through the library on in-memory sinks.

mod support;
use bench::gen::{Encoding, Generator, Sink, Summary};
use support::auc;

/// Generates `rows` rows on a pool of `threads` threads; returns (data, oracle, summary).
fn generate(
    rows: u64,
    seed: u64,
    teacher_seed: u64,
    threads: usize,
) -> (Vec<u8>, Vec<u8>, Summary) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let generator = Generator::new(seed, teacher_seed);
    let mut data = Sink::new(Vec::new(), Encoding::Plain).unwrap();
    let mut oracle = Sink::new(Vec::new(), Encoding::Plain).unwrap();
    let summary = pool
        .install(|| generator.write(rows, &mut data, Some(&mut oracle)))
        .unwrap();
    (data.finish().unwrap(), oracle.finish().unwrap(), summary)
}

fn lines(bytes: &[u8]) -> Vec<&str> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'));
    text.lines().collect()
}

#[test]
fn same_seeds_same_bytes_whatever_the_thread_count() {
    // Not a multiple of the chunk size, so the last chunk is partial.
    let rows = 3 * 4096 + 123;
    let (a, ao, _) = generate(rows, 1, 2, 1);
    let (b, bo, _) = generate(rows, 1, 2, 3);
    assert!(a == b && ao == bo);
    let (c, _, _) = generate(rows, 9, 2, 2);
    let (d, dox, _) = generate(rows, 1, 3, 2);
    assert_ne!(a, c);
    assert_ne!(ao, dox);
    // Different teacher, same rows: features are identical, only labels and probabilities differ.
    let features = |x: &[u8]| {
        lines(x)
            .iter()
            .map(|l| l[1..].to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(features(&a), features(&d));
    // A shorter file is a prefix of a longer one with the same seeds.
    let (e, _, _) = generate(5000, 1, 2, 2);
    assert!(a.starts_with(&e));
}

#[test]
fn zero_rows_is_empty() {
    let (data, oracle, summary) = generate(0, 1, 2, 2);
    assert!(data.is_empty() && oracle.is_empty());
    assert_eq!(summary, Summary::default());
}

#[test]
fn lines_have_criteo_layout_and_labels_follow_the_oracle() {
    let rows = 50_000;
    let (data, oracle, summary) = generate(rows, 5, 6, 2);
    let data = lines(&data);
    let oracle = lines(&oracle);
    assert_eq!(data.len() as u64, rows);
    assert_eq!(oracle.len() as u64, rows);
    assert_eq!(summary.rows, rows);
    let mut labels = Vec::new();
    let mut ending_in_tab = 0;
    let mut negatives = 0;
    for line in &data {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 40, "{line:?}");
        assert!(
            fields[0] == "0" || fields[0] == "1",
            "label {:?}",
            fields[0]
        );
        labels.push(fields[0] == "1");
        for f in &fields[1..14] {
            if !f.is_empty() {
                let x: i64 = f.parse().unwrap_or_else(|_| panic!("integer field {f:?}"));
                negatives += usize::from(x < 0);
            }
        }
        for f in &fields[14..] {
            assert!(
                f.is_empty()
                    || (f.len() == 8
                        && f.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))),
                "categorical field {f:?}"
            );
        }
        ending_in_tab += usize::from(line.ends_with('\t'));
    }
    assert!(negatives > 0, "no negative integers");
    assert!(ending_in_tab > 0, "no line ends with an empty field");
    let positives = labels.iter().filter(|&&l| l).count() as u64;
    assert_eq!(positives, summary.positives);
    let rate = summary.positive_rate();
    assert!((0.2..0.3).contains(&rate), "positive rate {rate}");

    let probs: Vec<f64> = oracle
        .iter()
        .map(|l| {
            assert!(l.len() == 8 && l.starts_with("0."), "oracle line {l:?}");
            l.parse().unwrap()
        })
        .collect();
    assert!(probs.iter().all(|&p| p > 0.0 && p < 1.0));
    let mean = probs.iter().sum::<f64>() / probs.len() as f64;
    assert!(
        (mean - rate).abs() < 0.01,
        "mean probability {mean} vs rate {rate}"
    );
    let oracle_auc = auc(&probs, &labels).unwrap();
    eprintln!("positive rate {rate:.4}, oracle auc {oracle_auc:.4}");
    assert!(
        (0.78..0.86).contains(&oracle_auc),
        "oracle auc {oracle_auc}"
    );
}

#[test]
fn missing_fields_are_correlated_across_columns() {
    let (data, _, _) = generate(50_000, 7, 8, 2);
    let rows: Vec<Vec<bool>> = lines(&data)
        .iter()
        .map(|l| l.split('\t').map(str::is_empty).collect())
        .collect();
    let n = rows.len() as f64;
    let rate = |col: usize| rows.iter().filter(|r| r[col]).count() as f64 / n;
    let both = |a: usize, b: usize| rows.iter().filter(|r| r[a] && r[b]).count() as f64 / n;
    // Field index: 1 + integer column (I1 = 1), 14 + categorical column (C1 = 14).
    for (a, b) in [
        (1, 10),
        (1, 12),
        (3, 4),
        (14 + 18, 14 + 19),
        (14 + 2, 14 + 11),
        (14 + 18, 14 + 25),
    ] {
        let (pa, pb, pab) = (rate(a), rate(b), both(a, b));
        assert!(pa > 0.0 && pb > 0.0);
        // Phi coefficient of the two missingness indicators; independent columns would give about 0.
        let phi = (pab - pa * pb) / (pa * (1.0 - pa) * pb * (1.0 - pb)).sqrt();
        assert!(
            phi > 0.2,
            "fields {a},{b}: phi {phi} (P(both) {pab}, P {pa}, {pb})"
        );
    }
    // Roughly Criteo's rates: I1 about 45% missing, C22 about 76%, I2 never.
    assert!((0.40..0.50).contains(&rate(1)), "I1 missing {}", rate(1));
    assert!(
        (0.70..0.82).contains(&rate(14 + 21)),
        "C22 missing {}",
        rate(14 + 21)
    );
    assert_eq!(rate(2), 0.0);
}

#[test]
fn gzip_sink_decodes_to_plain_bytes() {
    use std::io::Read;
    let rows = 10_000;
    let (plain, _, _) = generate(rows, 3, 4, 2);
    let generator = Generator::new(3, 4);
    let mut gz = Sink::new(Vec::new(), Encoding::Gzip { level: 1 }).unwrap();
    generator
        .write(rows, &mut gz, None::<&mut Sink<Vec<u8>>>)
        .unwrap();
    let gz = gz.finish().unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut text)
        .unwrap();
    assert_eq!(text, plain);
}
