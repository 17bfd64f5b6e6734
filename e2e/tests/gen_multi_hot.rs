//! Multi-hot generation (`gen-criteo --multi-hot`): deterministic, fixed bag sizes the criteo reader parses
//! into bags, and labels a pooled teacher predicts well (the oracle AUC).

mod support;
use bench::gen::{BagSizes, Encoding, Generator, Sink, VocabScale};
use support::auc;
use trainer::criteo::{parse_line, Batch, FeatureInput, FeatureLayout, LineKind, Row, NUM_SPARSE};

/// `rows` multi-hot rows with `sizes` on `threads` threads: (data, oracle).
fn generate(rows: u64, sizes: BagSizes, threads: usize) -> (Vec<u8>, Vec<u8>) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let generator = Generator::multi_hot(11, 12, VocabScale::NONE, sizes).unwrap();
    let mut data = Sink::new(Vec::new(), Encoding::Plain).unwrap();
    let mut oracle = Sink::new(Vec::new(), Encoding::Plain).unwrap();
    pool.install(|| generator.write(rows, &mut data, Some(&mut oracle)))
        .unwrap();
    (data.finish().unwrap(), oracle.finish().unwrap())
}

/// The layout the sizes imply: feature `j` reads C(j+1) with `tokens` = its size.
fn layout(sizes: BagSizes) -> FeatureLayout {
    FeatureLayout {
        features: (0..NUM_SPARSE)
            .map(|j| FeatureInput {
                ids: Default::default(),
                tokens: sizes.size(j),
                ..FeatureInput::one_hot(j)
            })
            .collect(),
    }
}

#[test]
fn deterministic_whatever_the_thread_count_and_unlike_one_hot() {
    let (a, oa) = generate(5_000, BagSizes::MLPERF, 1);
    let (b, ob) = generate(5_000, BagSizes::MLPERF, 2);
    assert!(a == b && oa == ob);
    let one_hot = Generator::new(11, 12).chunk(0, 10, false).data;
    assert_ne!(&a[..one_hot.len()], &one_hot[..]);
    // All sizes 1: the one-hot file of the same seeds.
    let ones = BagSizes::new([1; NUM_SPARSE]).unwrap();
    let (c, _) = generate(3_000, ones, 2);
    let plain = Generator::new(11, 12).chunk(0, 3_000, false).data;
    assert_eq!(c, plain);
}

#[test]
fn fields_hold_their_bag_sizes_and_parse_into_bags() {
    let sizes = BagSizes::MLPERF;
    let (data, _) = generate(2_000, sizes, 2);
    let text = std::str::from_utf8(&data).unwrap();
    let layout = layout(sizes);
    let mut row = Row::default();
    let mut batch = Batch::with_layout(2_000, &layout);
    let mut empty_one_hot = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 40);
        for j in 0..NUM_SPARSE {
            let field = fields[14 + j];
            if sizes.size(j) > 1 {
                let tokens: Vec<&str> = field.split('|').collect();
                assert_eq!(tokens.len(), sizes.size(j), "C{}: {field}", j + 1);
                assert!(tokens.iter().all(|t| t.len() == 8));
            } else {
                assert!(!field.contains('|'));
                empty_one_hot += usize::from(field.is_empty());
            }
        }
        assert_eq!(
            parse_line(line.as_bytes(), &mut row).unwrap(),
            LineKind::Full
        );
        batch.push_row_in(&row, &layout);
    }
    assert!(
        empty_one_hot > 0,
        "one-hot columns keep their missing fields"
    );
    assert_eq!(batch.len, 2_000);
    assert_eq!(batch.truncated, 0);
    for j in 0..NUM_SPARSE {
        if sizes.size(j) > 1 {
            let offsets = &batch.offsets[j];
            assert!(offsets
                .windows(2)
                .all(|w| w[1] - w[0] == sizes.size(j) as u32));
        } else {
            assert!(batch.offsets[j].is_empty());
        }
    }
}

#[test]
fn oracle_auc_of_multi_hot_data_is_high() {
    let (data, oracle) = generate(40_000, BagSizes::MLPERF, 2);
    let labels: Vec<bool> = std::str::from_utf8(&data)
        .unwrap()
        .lines()
        .map(|l| l.starts_with('1'))
        .collect();
    let probs: Vec<f64> = std::str::from_utf8(&oracle)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(labels.len(), probs.len());
    let rate = labels.iter().filter(|&&l| l).count() as f64 / labels.len() as f64;
    let oracle_auc = auc(&probs, &labels).unwrap();
    eprintln!("multi-hot: positive rate {rate:.4}, oracle auc {oracle_auc:.4}");
    assert!((0.2..0.3).contains(&rate), "positive rate {rate}");
    assert!(oracle_auc > 0.75, "oracle auc {oracle_auc}");
}
