//! Where a training pass's time goes: the training loop's wall time split into phases, the busy time of the
//! stage threads beside it, and the CPU seconds of the trainer and of local parameter servers (issue 44).
//!
//! # What is measured, and what it costs
//! - [`Phase`]: every moment of the training loop (the critical path) is in exactly one phase. A
//!   [`Stopwatch`] reads the monotonic clock once per phase change (a vDSO call, no system call), so the
//!   phases add up to the pass's wall time. The dense step reports its own forward, backward and optimizer
//!   split ([`crate::model::Dlrm::last_timing`]), and the wait for a batch's rows is split into the part
//!   spent behind the staleness gate (pushes not yet acknowledged: [`Phase::AckWait`]) and the rest
//!   ([`Phase::PullWait`]).
//! - [`Background`]: the reader (parse), plan and push-encoder threads run beside the loop; each adds the
//!   nanoseconds it worked (not the time it waited for the next stage) to a shared counter, two clock reads
//!   per batch.
//! - [`CpuSeconds`]: user + system CPU of this process and of the given server processes, from
//!   `/proc/<pid>/stat`, read at the start and end of a pass and at each progress line, never per step.
//!
//! Nothing here does per-row work, takes a lock, or allocates per step.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A phase of the training loop. The phases of a pass add up to its wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the next parsed and planned batch (the reader or the planner is behind).
    Input,
    /// On the loop: a batch's pull requests built and sent.
    Plan,
    /// Waiting for a batch's rows once its pull may go (servers, network, codecs).
    PullWait,
    /// Waiting for pushes to be acknowledged: the staleness gate in front of a pull, the synchronous wait of
    /// several trainers, and the last pushes at the end of a pass.
    AckWait,
    /// Pulled rows into the model's layout: decoding, gather and pooling.
    Gather,
    /// The trainer's own pushes still in flight replayed onto the pulled rows (staleness > 0).
    Replay,
    /// The dense model's forward pass (with the weights' bf16 packing).
    Forward,
    /// The dense model's backward pass.
    Backward,
    /// The dense optimizer step (with the sum of the chunks' gradients).
    Optimizer,
    /// Embedding gradients summed per unique id and handed to the push encoder.
    Push,
    /// Several trainers: the dense gradients summed over the trainers (waiting for them included).
    Reduce,
    /// Everything else on the loop: bookkeeping, progress lines, the first batch's output-bias start.
    Other,
}

/// Every phase, in report order.
pub const PHASES: [Phase; 12] = [
    Phase::Input,
    Phase::Plan,
    Phase::PullWait,
    Phase::AckWait,
    Phase::Gather,
    Phase::Replay,
    Phase::Forward,
    Phase::Backward,
    Phase::Optimizer,
    Phase::Push,
    Phase::Reduce,
    Phase::Other,
];

impl Phase {
    /// The phase's name in the summary, the metrics' `phase` label and the TensorBoard tags.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Input => "input",
            Phase::Plan => "plan",
            Phase::PullWait => "pull_wait",
            Phase::AckWait => "ack_wait",
            Phase::Gather => "gather",
            Phase::Replay => "replay",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Push => "push",
            Phase::Reduce => "reduce",
            Phase::Other => "other",
        }
    }

    /// The phase named `name`.
    pub fn from_name(name: &str) -> Option<Phase> {
        PHASES.into_iter().find(|p| p.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Seconds per phase; serialized as a map from [`Phase::name`] to seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseSeconds([f64; PHASES.len()]);

impl PhaseSeconds {
    /// Seconds of `phase`.
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase.index()]
    }

    /// Adds `seconds` to `phase`.
    pub fn add(&mut self, phase: Phase, seconds: f64) {
        self.0[phase.index()] += seconds;
    }

    /// The sum over the phases.
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }

    /// `(phase, seconds)` in report order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, f64)> + '_ {
        PHASES.into_iter().map(|p| (p, self.get(p)))
    }

    /// `self - earlier`, phase by phase.
    pub fn since(&self, earlier: &PhaseSeconds) -> PhaseSeconds {
        PhaseSeconds(std::array::from_fn(|i| self.0[i] - earlier.0[i]))
    }

    fn plus(&mut self, other: &PhaseSeconds) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

impl Serialize for PhaseSeconds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(PHASES.len()))?;
        for (p, v) in self.iter() {
            map.serialize_entry(p.name(), &v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PhaseSeconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        let mut out = PhaseSeconds::default();
        for (name, v) in map {
            let phase = Phase::from_name(&name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown phase {name:?}")))?;
            out.add(phase, v);
        }
        Ok(out)
    }
}

/// Splits the training loop's wall time into [`Phase`]s: each [`lap`](Self::lap) charges the time since the
/// previous one to a phase.
#[derive(Debug, Clone)]
pub struct Stopwatch {
    last: Instant,
    spent: PhaseSeconds,
}

impl Stopwatch {
    /// Starts timing now.
    pub fn start() -> Stopwatch {
        Stopwatch {
            last: Instant::now(),
            spent: PhaseSeconds::default(),
        }
    }

    /// Charges the time since the last lap to `phase`; returns it.
    pub fn lap(&mut self, phase: Phase) -> Duration {
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        self.spent.add(phase, d.as_secs_f64());
        d
    }

    /// Charges the time since the last lap to the phases of `split`, in proportion to their weights (the
    /// dense step's forward, backward and optimizer times, measured inside it); the rest of the interval, if
    /// the weights fall short of it, goes to `rest`.
    pub fn lap_split(&mut self, split: &[(Phase, f64)], rest: Phase) {
        let d = self.lap(rest).as_secs_f64();
        let weights: f64 = split.iter().map(|s| s.1).sum();
        if weights <= 0.0 {
            return;
        }
        // Measured inside the interval, so the weights cannot exceed it but for clock granularity.
        let scale = if weights > d { d / weights } else { 1.0 };
        for &(phase, w) in split {
            self.spent.add(phase, w * scale);
            self.spent.add(rest, -w * scale);
        }
    }

    /// Moves `seconds` of the time already charged to `from` over to `to` (a wait found, afterwards, to have
    /// been partly of another kind).
    pub fn recharge(&mut self, from: Phase, to: Phase, seconds: f64) {
        self.spent.add(from, -seconds);
        self.spent.add(to, seconds);
    }

    /// Restarts the clock without charging the time since the last lap (periodic evaluations and
    /// checkpoints, which a pass leaves out of its seconds).
    pub fn skip(&mut self) {
        self.last = Instant::now();
    }

    /// Seconds per phase so far.
    pub fn spent(&self) -> PhaseSeconds {
        self.spent
    }
}

/// Busy seconds of the threads running beside the training loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Background {
    /// The reader thread: reading and parsing (or copying shard rows).
    pub parse: f64,
    /// The plan thread: dedup, routing, prefetch requests.
    pub plan: f64,
    /// The push encoder thread: encoding, error feedback.
    pub encode: f64,
}

impl Background {
    fn since(&self, e: &Background) -> Background {
        Background {
            parse: self.parse - e.parse,
            plan: self.plan - e.plan,
            encode: self.encode - e.encode,
        }
    }

    fn plus(&mut self, o: &Background) {
        self.parse += o.parse;
        self.plan += o.plan;
        self.encode += o.encode;
    }

    /// `(name, seconds)` in report order.
    pub fn iter(&self) -> [(&'static str, f64); 3] {
        [
            ("parse", self.parse),
            ("plan", self.plan),
            ("encode", self.encode),
        ]
    }
}

/// The shared busy counters (nanoseconds) of the stage threads.
#[derive(Debug, Clone, Default)]
pub struct BusyCounters {
    /// The reader thread's.
    pub parse: Arc<AtomicU64>,
    /// The plan thread's.
    pub plan: Arc<AtomicU64>,
    /// The push encoder thread's.
    pub encode: Arc<AtomicU64>,
}

impl BusyCounters {
    /// The counters' values, in seconds.
    pub fn read(&self) -> Background {
        let s = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 * 1e-9;
        Background {
            parse: s(&self.parse),
            plan: s(&self.plan),
            encode: s(&self.encode),
        }
    }
}

/// Adds the time since `since` to `counter` (nanoseconds) and returns now.
pub fn add_busy(counter: &AtomicU64, since: Instant) -> Instant {
    let now = Instant::now();
    let nanos = u64::try_from((now - since).as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(nanos, Ordering::Relaxed);
    now
}

/// CPU seconds (user + system) of the trainer process and of each watched server process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSeconds {
    /// This trainer process.
    pub trainer: f64,
    /// Each watched parameter-server process (the local servers `trainer demo` starts), in server order.
    #[serde(default)]
    pub servers: Vec<f64>,
}

impl CpuSeconds {
    /// `self - earlier`, each process's at least 0 (a server that exited reads as 0 afterwards).
    pub fn since(&self, earlier: &CpuSeconds) -> CpuSeconds {
        CpuSeconds {
            trainer: (self.trainer - earlier.trainer).max(0.0),
            servers: self
                .servers
                .iter()
                .zip(earlier.servers.iter().chain(std::iter::repeat(&0.0)))
                .map(|(a, b)| (a - b).max(0.0))
                .collect(),
        }
    }

    fn plus(&mut self, o: &CpuSeconds) {
        self.trainer += o.trainer;
        if self.servers.len() < o.servers.len() {
            self.servers.resize(o.servers.len(), 0.0);
        }
        for (a, b) in self.servers.iter_mut().zip(&o.servers) {
            *a += b;
        }
    }

    /// The servers' CPU seconds together.
    pub fn servers_total(&self) -> f64 {
        self.servers.iter().sum()
    }
}

/// Reads the CPU seconds of this process and of `servers` (their pids): `/proc/<pid>/stat`.
#[derive(Debug, Clone, Default)]
pub struct CpuWatch {
    servers: Vec<u32>,
}

impl CpuWatch {
    /// Watches this process and the processes `servers`.
    pub fn new(servers: Vec<u32>) -> CpuWatch {
        CpuWatch { servers }
    }

    /// The CPU seconds so far; a server whose `/proc` entry is gone (it exited) counts as 0, which a caller
    /// taking differences sees as a negative interval and clamps.
    pub fn read(&self) -> CpuSeconds {
        CpuSeconds {
            trainer: process_cpu_seconds(None).unwrap_or(0.0),
            servers: self
                .servers
                .iter()
                .map(|&pid| process_cpu_seconds(Some(pid)).unwrap_or(0.0))
                .collect(),
        }
    }
}

/// User + system CPU seconds of process `pid` (this process for `None`), from `/proc/<pid>/stat`.
pub fn process_cpu_seconds(pid: Option<u32>) -> std::io::Result<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let text = std::fs::read_to_string(&path)?;
    parse_stat_cpu(&text, clock_ticks()).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{path}: no utime and stime fields"),
        )
    })
}

/// `(utime + stime) / ticks` from the text of a `/proc/<pid>/stat`: fields 14 and 15, counted after the
/// command name, which is in parentheses and may itself hold spaces and parentheses.
fn parse_stat_cpu(text: &str, ticks: f64) -> Option<f64> {
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th and stime (15) the 13th.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Where a pass's time went: its wall time split into phases of the training loop, the stage threads'
/// busy time, and the CPU seconds of the processes (the summary's `time`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeReport {
    /// Training steps (batches) in the pass.
    pub steps: u64,
    /// Wall seconds of the pass: the sum of [`critical`](Self::critical).
    pub seconds: f64,
    /// The training loop's wall seconds per phase.
    pub critical: PhaseSeconds,
    /// Busy seconds of the reader, plan and push-encoder threads (beside the loop, overlapping it).
    pub background: Background,
    /// CPU seconds of the trainer process and of the local servers during the pass.
    pub cpu: CpuSeconds,
}

impl TimeReport {
    /// The report of the interval between `earlier` and `self` (two snapshots of one pass).
    pub fn since(&self, earlier: &TimeReport) -> TimeReport {
        TimeReport {
            steps: self.steps - earlier.steps,
            seconds: self.seconds - earlier.seconds,
            critical: self.critical.since(&earlier.critical),
            background: self.background.since(&earlier.background),
            cpu: self.cpu.since(&earlier.cpu),
        }
    }

    /// Adds a later pass (another epoch).
    pub fn add(&mut self, other: &TimeReport) {
        self.steps += other.steps;
        self.seconds += other.seconds;
        self.critical.plus(&other.critical);
        self.background.plus(&other.background);
        self.cpu.plus(&other.cpu);
    }

    /// Milliseconds per step of `seconds`.
    pub fn per_step_ms(&self, seconds: f64) -> f64 {
        seconds / self.steps.max(1) as f64 * 1e3
    }

    /// What bounds the pass: the largest of the dense compute (forward, backward, optimizer, reduce), the
    /// waits for the servers (pulls and acknowledgements), the input (reader and planner behind), and the
    /// embedding work on the loop (plan, gather, push); with how much of the loop's time it took.
    pub fn bound(&self) -> (&'static str, f64) {
        let c = &self.critical;
        let groups = [
            (
                "dense compute",
                c.get(Phase::Forward)
                    + c.get(Phase::Backward)
                    + c.get(Phase::Optimizer)
                    + c.get(Phase::Reduce),
            ),
            (
                "waiting for the servers",
                c.get(Phase::PullWait) + c.get(Phase::AckWait),
            ),
            ("input (reader and planner)", c.get(Phase::Input)),
            (
                "embedding rows on the trainer",
                c.get(Phase::Plan)
                    + c.get(Phase::Gather)
                    + c.get(Phase::Replay)
                    + c.get(Phase::Push),
            ),
        ];
        let (name, secs) = groups
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("four groups");
        (name, secs / c.total().max(1e-12))
    }

    /// The closing lines: per step, the loop's phases (largest first) and the stage threads; the CPU per
    /// process; what bounds the pass.
    pub fn render(&self, samples: u64) -> String {
        let mut out = String::new();
        let total = self.critical.total().max(1e-12);
        let mut phases: Vec<(Phase, f64)> = self.critical.iter().filter(|p| p.1 > 0.0).collect();
        phases.sort_by(|a, b| b.1.total_cmp(&a.1));
        let _ = write!(
            out,
            "time per step   {:.2} ms over {} steps:",
            self.per_step_ms(self.seconds),
            self.steps
        );
        for (i, (p, s)) in phases.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(
                out,
                "{sep}{} {:.2} ({:.0}%)",
                p.name().replace('_', " "),
                self.per_step_ms(*s),
                s / total * 100.0
            );
        }
        out.push('\n');
        let b = &self.background;
        let _ = writeln!(
            out,
            "own threads     parse {:.2} ms/step, plan {:.2}, push encode {:.2} (beside the loop)",
            self.per_step_ms(b.parse),
            self.per_step_ms(b.plan),
            self.per_step_ms(b.encode)
        );
        let n = samples.max(1) as f64;
        let wall = self.seconds.max(1e-12);
        let _ = write!(
            out,
            "CPU             trainer {:.1} s ({:.2} us/sample, {:.2} cores)",
            self.cpu.trainer,
            self.cpu.trainer / n * 1e6,
            self.cpu.trainer / wall
        );
        if !self.cpu.servers.is_empty() {
            let each: Vec<String> = self.cpu.servers.iter().map(|s| format!("{s:.1}")).collect();
            let ps = self.cpu.servers_total();
            let _ = write!(
                out,
                ", local ps-servers {:.1} s ({}; {:.2} us/sample, {:.2} cores)",
                ps,
                each.join(" + "),
                ps / n * 1e6,
                ps / wall
            );
        }
        out.push('\n');
        let (name, share) = self.bound();
        let _ = writeln!(
            out,
            "bound by        {name} ({:.0}% of the loop's time)",
            share * 100.0
        );
        out
    }
}

/// Sets the gauges of a pass's time so far: the stage threads' busy seconds and the processes' CPU seconds
/// (the per-step phase histograms are recorded as the steps go).
pub fn export_metrics(time: &TimeReport) {
    use crate::metrics as m;
    for (name, secs) in time.background.iter() {
        metrics::gauge!(m::THREAD_BUSY_SECONDS, "thread" => name).set(secs);
    }
    metrics::gauge!(m::CPU_SECONDS).set(time.cpu.trainer);
    for (i, secs) in time.cpu.servers.iter().enumerate() {
        metrics::gauge!(m::LOCAL_SERVER_CPU_SECONDS, "server" => i.to_string()).set(*secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_cpu(line, 100.0), Some(3.0));
        assert_eq!(parse_stat_cpu("4242 (x) S 1 2", 100.0), None);
    }

    #[test]
    fn this_process_uses_cpu() {
        let before = process_cpu_seconds(None).unwrap();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = process_cpu_seconds(None).unwrap();
        assert!(after > before, "{before} -> {after}");
        assert!(process_cpu_seconds(Some(u32::MAX)).is_err());
    }

    #[test]
    fn laps_add_up_to_the_wall_time_and_splits_keep_the_total() {
        let begin = Instant::now();
        let mut w = Stopwatch::start();
        std::thread::sleep(Duration::from_millis(2));
        let input = w.lap(Phase::Input).as_secs_f64();
        assert!(input >= 0.002);
        std::thread::sleep(Duration::from_millis(2));
        w.skip();
        assert_eq!(w.spent().total(), input, "skipped time is not charged");
        std::thread::sleep(Duration::from_millis(3));
        // Weights as a dense step would report them: 1 ms forward, 1 ms backward.
        w.lap_split(
            &[(Phase::Forward, 0.001), (Phase::Backward, 0.001)],
            Phase::Other,
        );
        let s = w.spent();
        assert!((s.get(Phase::Forward) - 0.001).abs() < 1e-12);
        assert!((s.get(Phase::Backward) - 0.001).abs() < 1e-12);
        assert!(s.get(Phase::Other) >= 0.001 - 1e-9, "{s:?}");
        assert!(s.total() <= begin.elapsed().as_secs_f64() - 0.002);
        w.recharge(Phase::Input, Phase::AckWait, 0.0005);
        assert!((w.spent().total() - s.total()).abs() < 1e-12);
        assert_eq!(w.spent().get(Phase::AckWait), 0.0005);
        // Weights beyond the interval (clock granularity) are scaled down to it.
        let mut w = Stopwatch::start();
        w.lap_split(&[(Phase::Forward, 10.0)], Phase::Other);
        let s = w.spent();
        assert!(
            s.get(Phase::Other).abs() < 1e-12 && s.get(Phase::Forward) < 1.0,
            "{s:?}"
        );
    }

    #[test]
    fn reports_round_trip_through_json_and_subtract() {
        let mut a = TimeReport {
            steps: 10,
            seconds: 2.0,
            ..Default::default()
        };
        a.critical.add(Phase::Forward, 1.5);
        a.critical.add(Phase::PullWait, 0.5);
        a.background.parse = 0.7;
        a.cpu = CpuSeconds {
            trainer: 3.0,
            servers: vec![0.5, 0.3],
        };
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains("\"pull_wait\":0.5"), "{json}");
        let back: TimeReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        assert!(serde_json::from_str::<TimeReport>(&json.replace("pull_wait", "nap")).is_err());
        let mut b = a.clone();
        b.add(&a);
        let d = b.since(&a);
        assert_eq!(d, a);
        assert_eq!(a.bound(), ("dense compute", 0.75));
        let text = a.render(1000);
        assert!(text.contains("forward 150.00 (75%)"), "{text}");
        assert!(
            text.contains("local ps-servers 0.8 s (0.5 + 0.3;"),
            "{text}"
        );
        assert!(
            text.contains("bound by        dense compute (75%"),
            "{text}"
        );
    }
}
