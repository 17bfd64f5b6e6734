//! [`RocksStore`]: the [`Store`] on RocksDB.
//!
//! DESIGN.md: "one database per PS process, a column family per table, key = id (big-endian), value = row
//! bytes". Column families are named `t<id>`; metadata lives in the `meta` column family. Big-endian keys make
//! RocksDB's bytewise order the numeric id order, so scans come back sorted by id.
//!
//! On open, the column families already in the directory are listed (`DB::list_cf`) and opened, so a reopened
//! database knows its tables before any [`Store::ensure_table`]. Row values are random floats, so compression
//! is off.
//!
//! # Tuning for the capacity tier ([`RocksTuning`])
//! The tier reads and writes single rows of ~80 bytes (dim 16 + row-wise Adagrad) by key, never ranges, and
//! many of its reads are for ids that were never written (rows created on first use): DESIGN.md's "RocksDB
//! tuned for ~80-byte point reads". So, per column family, with [`RocksTuning::point_lookup`]:
//! - one LRU block cache shared by every column family, sized by the server ([`RocksTuning::block_cache_bytes`]),
//!   for data blocks only, so a read of a cold row costs one block read;
//! - index and filter blocks held by the table readers, outside the cache, for as long as their file lives:
//!   every first sight of an id probes the filter of each level, so the tier touches all of them at random,
//!   and in a cache they thrashed (the cache's 1 MiB shards against the ~0.9 MiB filter of one 64 MiB file:
//!   each probe of a new id read whole filter blocks back, bench/figures/history.md, "Fifteenth round"). They cost
//!   [`TABLE_READER_BYTES_PER_ROW`] per row on disk, which `ps-server plan` charges;
//! - whole-key bloom filters (10 bits per key, ~1% false positives) on every level, so a read of an id that was
//!   never written (a new row) touches no data block, and a memtable bloom filter (whole key) so that reads
//!   skip the memtables' skip lists for keys they do not hold;
//! - 4 KiB data blocks (about 50 rows) with a hash index inside each block, so the key is found without a
//!   binary search;
//! - memtables capped at [`WRITE_BUFFER_BYTES`] over all column families, so memory stays bounded with many
//!   tables;
//! - level compaction (RocksDB's default): lower read amplification than universal, and the tier reads at
//!   least as often as it writes.
//!
//! The measured effect of each choice is in bench/figures/history.md ("Ninth round").
//!
//! # Write-back as sorted files ([`Store::write_sorted`])
//! The periodic write-back of a table without a memory budget writes every dirty row of it, often hundreds of
//! thousands. Through write batches they went to the write-ahead log, into the hash memtables, and out again
//! by memtable flushes that must first sort them (a hash memtable has no order: the flush rebuilds a skip list),
//! about half of a server's CPU in a DLRM-v2 run (bench/figures/issue-44.md section 9). Instead the rows, in id
//! order, go into SST files of at most [`INGEST_FILE_BYTES`] built with the column family's own options in
//! [`INGEST_DIR`], which RocksDB then takes in (`IngestExternalFile`, files moved, all of one call at once):
//! no log, no memtable, no flush, and the files are synced before they are added. A memtable holding ids in
//! their range is flushed first, so the ingested rows are the newest. Eviction under a memory budget keeps
//! write batches: its rows are read back soon, and from the memtable.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, DBWithThreadMode,
    DataBlockIndexType, IngestExternalFileOptions, MemtableFactory, MultiThreaded, Options,
    ReadOptions, SliceTransform, SstFileWriter, WriteBatch, WriteOptions,
};

use crate::batch::DirtyBatch;
use crate::error::StoreError;
use crate::store::{check_ascending, GetFn, MetaWrite, ScanFn, SortedRowsFn, Store, StoreMemory};

/// Column family holding metadata.
const META_CF: &str = "meta";

type Db = DBWithThreadMode<MultiThreaded>;

/// A [`Store`] backed by one RocksDB database.
pub struct RocksStore {
    db: Db,
    path: PathBuf,
    /// Column family options (new tables get them too).
    tuning: RocksTuning,
    /// The block cache every column family shares.
    cache: Cache,
    /// The column families' names; its lock serializes column family creation (two `ensure_table` racing
    /// would both try to create it).
    column_families: Mutex<Vec<String>>,
    /// Bytes of a [`Store::write_sorted`] file before the next begins ([`INGEST_FILE_BYTES`]; smaller in tests).
    ingest_file_bytes: u64,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("path", &self.path)
            .finish()
    }
}

/// The write failpoint ([`crate::failpoints::STORE_WRITE`]), evaluated before each write: configured
/// `return`, the write fails with an injected I/O error naming `op`. Only in builds with the `failpoints`
/// feature; the call sites are compiled out without it.
#[cfg(feature = "failpoints")]
fn fail_write(op: impl FnOnce() -> String) -> Result<(), StoreError> {
    fail::fail_point!(crate::failpoints::STORE_WRITE, |arg| {
        Err(StoreError::Backend {
            op: op(),
            detail: crate::failpoints::injected_detail(arg),
        })
    });
    Ok(())
}

fn cf_name(table: u32) -> String {
    format!("t{table}")
}

/// How a [`RocksStore`] sets up its column families ("Tuning for the capacity tier").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocksTuning {
    /// Blooms, block cache, block hash index and memtable bloom for point reads; `false` keeps RocksDB's
    /// defaults (for comparisons).
    pub point_lookup: bool,
    /// Bytes of the block cache all column families share.
    pub block_cache_bytes: usize,
    /// Free bytes the data directory's filesystem keeps: a write that finds less free is refused
    /// ([`StoreError::Backend`] naming both) before RocksDB runs out of space, 0 for none. RocksDB 7.8 (the
    /// Debian library this crate links) aborts the process on a write after a failed WAL write
    /// (facebook/rocksdb#12448, fixed in 9.1): a real full disk must never reach it.
    pub reserve_bytes: u64,
}

/// The disk reserve of a default [`RocksTuning`]: 256 MiB, what the memtables hold at most
/// ([`WRITE_BUFFER_BYTES`]), so that a memtable flush still fits when writes are refused.
pub const DEFAULT_RESERVE_BYTES: u64 = 256 << 20;

/// Bytes free for unprivileged writers on the filesystem holding `path` (`statvfs`).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs; statvfs fills it on success.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialized `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The block cache of a default [`RocksTuning`]: 64 MiB.
pub const DEFAULT_BLOCK_CACHE_BYTES: usize = 64 << 20;

/// Memory of the table readers (index and filter blocks, [`RocksTuning::point_lookup`]) per row on disk: 10
/// bloom bits (1.25 bytes) plus one index entry per 4 KiB data block of ~45 rows. Measured 1.55 bytes per
/// distinct row of a server (36.3 MB at 23.4M rows, a budgeted scale run, bench/figures/history.md "Fifteenth round");
/// the rest is headroom for files compaction has not yet merged.
pub const TABLE_READER_BYTES_PER_ROW: f64 = 1.9;

/// Memtable bytes of all column families together (RocksDB's `db_write_buffer_size`: past it the largest
/// memtable is flushed). Without it each of a server's ~27 column families could hold 2 x 64 MiB of
/// memtables.
pub const WRITE_BUFFER_BYTES: usize = 256 << 20;

impl Default for RocksTuning {
    fn default() -> RocksTuning {
        RocksTuning {
            point_lookup: true,
            block_cache_bytes: DEFAULT_BLOCK_CACHE_BYTES,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
        }
    }
}

/// Column family options of the column family `name` for `tuning`, sharing `cache`.
fn cf_options(name: &str, tuning: RocksTuning, cache: &Cache) -> Options {
    let mut o = Options::default();
    o.set_compression_type(DBCompressionType::None);
    if tuning.point_lookup {
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(cache);
        t.set_block_size(4 << 10);
        t.set_bloom_filter(10.0, false);
        t.set_whole_key_filtering(true);
        t.set_cache_index_and_filter_blocks(false);
        t.set_data_block_index_type(DataBlockIndexType::BinaryAndHash);
        t.set_data_block_hash_ratio(0.75);
        o.set_block_based_table_factory(&t);
        o.set_memtable_prefix_bloom_ratio(0.02);
        o.set_memtable_whole_key_filtering(true);
        if is_table_cf(name) {
            // Rows evicted by the tier are read back soon, mostly while still in a memtable (256 MiB of
            // memtables hold a million rows): a skip-list search per read-back was 36% of a server's CPU at 2x
            // over budget. A hash of the whole key finds them in O(1); full scans (scan_rows) ask for
            // total order, which this memtable serves by sorting (snapshots flush memtables first anyway).
            // The whole key is the hash key (a fixed 8-byte prefix would break on a corrupt key of another length).
            o.set_prefix_extractor(SliceTransform::create_noop());
            o.set_memtable_factory(MemtableFactory::HashSkipList {
                bucket_count: HASH_BUCKETS,
                height: 4,
                branching_factor: 4,
            });
        }
    }
    o
}

/// Bytes of one sorted file of a [`Store::write_sorted`] before the next begins (RocksDB's default target size of
/// a level-1 file): a write-back of more rows is several files with consecutive id ranges, ingested together.
pub const INGEST_FILE_BYTES: u64 = 64 << 20;

/// The folder, inside the database directory, where [`Store::write_sorted`] builds its files before RocksDB
/// takes them in (moved, not copied: same filesystem). Emptied when the store opens (files of a write the
/// process did not finish).
pub const INGEST_DIR: &str = "ingest";

/// Hash buckets of a table's memtable (8 bytes each, allocated with the memtable: 512 KiB; a full 64 MiB memtable
/// of ~100-byte rows puts about 10 keys in a bucket).
pub const HASH_BUCKETS: usize = 1 << 16;

/// Whether `name` is a table's column family ([`cf_name`]), whose keys are 8-byte ids.
fn is_table_cf(name: &str) -> bool {
    name.strip_prefix('t')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn backend(op: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> StoreError {
    let op = op.into();
    move |e| StoreError::Backend {
        op,
        detail: e.into_string(),
    }
}

fn decode_key(table: u32, key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| StoreError::CorruptKey {
        table,
        len: key.len(),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

impl RocksStore {
    /// Opens (creating if missing) the database at `path` with every column family it already has, plus
    /// `meta`, tuned with [`RocksTuning::default`].
    pub fn open(path: impl AsRef<Path>) -> Result<RocksStore, StoreError> {
        RocksStore::open_tuned(path, RocksTuning::default())
    }

    /// [`RocksStore::open`] with column families set up by `tuning`.
    pub fn open_tuned(
        path: impl AsRef<Path>,
        tuning: RocksTuning,
    ) -> Result<RocksStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let cache = Cache::new_lru_cache(tuning.block_cache_bytes);
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_db_write_buffer_size(WRITE_BUFFER_BYTES);
        // The tables' hash memtables take one writer at a time (writes are WriteBatches from the write-back
        // and eviction threads; RocksDB's write group still batches concurrent ones).
        opts.set_allow_concurrent_memtable_write(!tuning.point_lookup);
        // RocksDB's own log (`LOG` in the database directory) at warnings only: with the Debian RocksDB 7.8, a
        // line that meets a full disk leaves its writer in error and the next line aborts the process
        // (assertion `sync_without_flush_called_`, facebook/rocksdb#12448), even though the disk reserve keeps
        // every row write out of the full disk. Found with a tmpfs kept full for ~3 s: the LOG ended mid-line
        // and the server aborted at the next event. Flush, compaction and statistics lines are INFO.
        opts.set_log_level(rocksdb::LogLevel::Warn);
        let mut names = if path.join("CURRENT").exists() {
            Db::list_cf(&opts, &path).map_err(backend(format!("list_cf {}", path.display())))?
        } else {
            Vec::new()
        };
        for required in ["default", META_CF] {
            if !names.iter().any(|n| n == required) {
                names.push(required.to_owned());
            }
        }
        let descriptors = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, cf_options(n, tuning, &cache)));
        let db = Db::open_cf_descriptors(&opts, &path, descriptors)
            .map_err(backend(format!("open {}", path.display())))?;
        let ingest = path.join(INGEST_DIR);
        if ingest.exists() {
            std::fs::remove_dir_all(&ingest).map_err(|e| StoreError::Backend {
                op: format!("open {}", path.display()),
                detail: format!(
                    "removing unfinished write-back files in {}: {e}",
                    ingest.display()
                ),
            })?;
        }
        tracing::info!(path = %path.display(), column_families = names.len(), ?tuning, "opened rocksdb");
        Ok(RocksStore {
            db,
            path,
            tuning,
            cache,
            column_families: Mutex::new(names),
            ingest_file_bytes: INGEST_FILE_BYTES,
        })
    }

    /// Opens the database at `path` (a snapshot's checkpoint, say) read-only, with every column family it has:
    /// reads work, writes fail with [`StoreError::Backend`]. Fails if `path` holds no database.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<RocksStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let tuning = RocksTuning::default();
        let mut opts = Options::default();
        // As in open_tuned: the tables' hash memtables refuse concurrent writers.
        opts.set_allow_concurrent_memtable_write(!tuning.point_lookup);
        let cache = Cache::new_lru_cache(tuning.block_cache_bytes);
        let names =
            Db::list_cf(&opts, &path).map_err(backend(format!("list_cf {}", path.display())))?;
        let descriptors = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, cf_options(n, tuning, &cache)));
        let db = Db::open_cf_descriptors_read_only(&opts, &path, descriptors, false)
            .map_err(backend(format!("open read-only {}", path.display())))?;
        Ok(RocksStore {
            db,
            path,
            tuning,
            cache,
            column_families: Mutex::new(names),
            ingest_file_bytes: INGEST_FILE_BYTES,
        })
    }

    /// Writes `table`'s memtables to SST files now (RocksDB does it on its own when they fill): for
    /// measurements of reads from files rather than from memtables.
    pub fn flush_table_memtables(&self, table: u32) -> Result<(), StoreError> {
        let cf = self.table_cf(table)?;
        self.db
            .flush_cf(&cf)
            .map_err(backend(format!("flush memtables of table {table}")))
    }

    /// Sets the size at which a [`Store::write_sorted`] begins a new file (tests of writes of several files).
    #[cfg(test)]
    pub(crate) fn set_ingest_file_bytes(&mut self, bytes: u64) {
        self.ingest_file_bytes = bytes;
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn table_cf(
        &self,
        table: u32,
    ) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>, StoreError> {
        self.db
            .cf_handle(&cf_name(table))
            .ok_or(StoreError::UnknownTable(table))
    }

    /// Refuses write `op` when the data directory's filesystem has less free than the reserve
    /// ([`RocksTuning::reserve_bytes`]).
    fn check_reserve(&self, op: impl FnOnce() -> String) -> Result<(), StoreError> {
        let reserve = self.tuning.reserve_bytes;
        if reserve == 0 {
            return Ok(());
        }
        match free_bytes(&self.path) {
            Ok(free) if free < reserve => Err(StoreError::Backend {
                op: op(),
                detail: format!(
                    "No space left on device: {free} bytes free on the filesystem of {}, below the disk reserve \
                     of {reserve} bytes (disk-reserve-mib); writes are refused until space is freed",
                    self.path.display()
                ),
            }),
            Ok(_) => Ok(()),
            // Unknown free space: let the write try.
            Err(_) => Ok(()),
        }
    }

    fn meta_cf(&self) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>, StoreError> {
        self.db
            .cf_handle(META_CF)
            .ok_or_else(|| StoreError::Backend {
                op: "meta".into(),
                detail: "meta column family missing".into(),
            })
    }
}

impl Store for RocksStore {
    fn ensure_table(&self, table: u32) -> Result<(), StoreError> {
        let name = cf_name(table);
        if self.db.cf_handle(&name).is_some() {
            return Ok(());
        }
        let mut names = self.column_families.lock();
        if self.db.cf_handle(&name).is_none() {
            self.check_reserve(|| format!("create column family {name}"))?;
            self.db
                .create_cf(&name, &cf_options(&name, self.tuning, &self.cache))
                .map_err(backend(format!("create column family {name}")))?;
            tracing::info!(table, "created column family");
            names.push(name);
        }
        Ok(())
    }

    fn write_rows(&self, table: u32, rows: &DirtyBatch, sync: bool) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| format!("write_rows table {table}"))?;
        self.check_reserve(|| format!("write_rows table {table}"))?;
        let cf = self.table_cf(table)?;
        let mut batch = WriteBatch::default();
        for (id, bytes) in rows.iter() {
            batch.put_cf(&cf, id.to_be_bytes(), bytes);
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db
            .write_opt(batch, &wo)
            .map_err(backend(format!("write_rows table {table}")))
    }

    fn write_tables(
        &self,
        tables: &[(u32, &DirtyBatch)],
        meta: &[MetaWrite],
        sync: bool,
    ) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| "write_tables".into())?;
        self.check_reserve(|| {
            format!(
                "write_tables {:?}",
                tables.iter().map(|t| t.0).collect::<Vec<_>>()
            )
        })?;
        let mut batch = WriteBatch::default();
        for (table, rows) in tables {
            let cf = self.table_cf(*table)?;
            for (id, bytes) in rows.iter() {
                batch.put_cf(&cf, id.to_be_bytes(), bytes);
            }
        }
        if !meta.is_empty() {
            let cf = self.meta_cf()?;
            for m in meta {
                match &m.value {
                    Some(v) => batch.put_cf(&cf, &m.key, v),
                    None => batch.delete_cf(&cf, &m.key),
                }
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch, &wo).map_err(backend(format!(
            "write_tables {:?}",
            tables.iter().map(|t| t.0).collect::<Vec<_>>()
        )))
    }

    fn write_sorted(&self, table: u32, rows: &mut SortedRowsFn<'_>) -> Result<u64, StoreError> {
        let op = || format!("write_sorted table {table}");
        #[cfg(feature = "failpoints")]
        fail_write(op)?;
        self.check_reserve(op)?;
        let cf = self.table_cf(table)?;
        let dir = self.path.join(INGEST_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::Backend {
            op: op(),
            detail: format!("creating {}: {e}", dir.display()),
        })?;
        // The column family's own options, so the files have its block size, filters and block index.
        let opts = cf_options(&cf_name(table), self.tuning, &self.cache);
        let mut files: Vec<PathBuf> = Vec::new();
        let result = (|| {
            let mut writer: Option<SstFileWriter<'_>> = None;
            let mut last = None;
            let mut written = 0u64;
            rows(&mut |id, bytes| {
                check_ascending(table, last, id)?;
                last = Some(id);
                let w = match &mut writer {
                    Some(w) => w,
                    None => {
                        self.check_reserve(op)?;
                        let file = dir.join(format!("t{table}-{}.sst", files.len()));
                        let w = SstFileWriter::create(&opts);
                        w.open(&file).map_err(backend(op()))?;
                        files.push(file);
                        writer.insert(w)
                    }
                };
                w.put(id.to_be_bytes(), bytes).map_err(backend(op()))?;
                written += 1;
                if w.file_size() >= self.ingest_file_bytes {
                    if let Some(mut w) = writer.take() {
                        w.finish().map_err(backend(op()))?;
                    }
                }
                Ok(())
            })?;
            if let Some(mut w) = writer.take() {
                w.finish().map_err(backend(op()))?;
            }
            if !files.is_empty() {
                // Moved into the database (hard links), all files in one ingestion: all or nothing. Memtables
                // holding ids in the files' ranges are flushed first, so the files' rows are the newest.
                let mut io = IngestExternalFileOptions::default();
                io.set_move_files(true);
                self.db
                    .ingest_external_file_cf_opts(&cf, &io, files.clone())
                    .map_err(backend(op()))?;
            }
            Ok(written)
        })();
        // Whatever was not moved in (all of them after a failure; none after an ingestion, which unlinks them).
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
        result
    }

    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| format!("delete_rows table {table}"))?;
        self.check_reserve(|| format!("delete_rows table {table}"))?;
        let cf = self.table_cf(table)?;
        let mut batch = WriteBatch::default();
        for id in ids {
            batch.delete_cf(&cf, id.to_be_bytes());
        }
        self.db
            .write(batch)
            .map_err(backend(format!("delete_rows table {table}")))
    }

    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError> {
        let cf = self.table_cf(table)?;
        // Every row, past the prefix extractor's single-key prefixes.
        let mut ro = ReadOptions::default();
        ro.set_total_order_seek(true);
        let mut it = self.db.raw_iterator_cf_opt(&cf, ro);
        it.seek_to_first();
        while let (Some(key), Some(value)) = (it.key(), it.value()) {
            f(decode_key(table, key)?, value)?;
            it.next();
        }
        it.status()
            .map_err(backend(format!("scan_rows table {table}")))
    }

    fn scan_ids(
        &self,
        table: u32,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), StoreError> {
        let cf = self.table_cf(table)?;
        let mut ro = ReadOptions::default();
        ro.set_total_order_seek(true);
        let mut it = self.db.raw_iterator_cf_opt(&cf, ro);
        match after {
            None => it.seek_to_first(),
            // Big-endian keys sort like the ids: the first key at or above `after + 1`.
            Some(u64::MAX) => return Ok(()),
            Some(a) => it.seek((a + 1).to_be_bytes()),
        }
        let mut taken = 0;
        while taken < limit {
            let Some(key) = it.key() else { break };
            out.push(decode_key(table, key)?);
            taken += 1;
            it.next();
        }
        it.status()
            .map_err(backend(format!("scan_ids table {table}")))
    }

    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError> {
        let cf = self.table_cf(table)?;
        let keys: Vec<[u8; 8]> = ids.iter().map(|id| id.to_be_bytes()).collect();
        // Big-endian keys sort like the ids: ascending ids let RocksDB skip sorting the batch.
        let sorted = ids.windows(2).all(|w| w[0] < w[1]);
        let values = self.db.batched_multi_get_cf(&cf, &keys, sorted);
        for (i, value) in values.into_iter().enumerate() {
            let value = value.map_err(backend(format!("get_rows table {table}")))?;
            f(i, value.as_deref())?;
        }
        Ok(())
    }

    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| format!("put_meta {key}"))?;
        self.check_reserve(|| format!("put_meta {key}"))?;
        let cf = self.meta_cf()?;
        let mut wo = WriteOptions::default();
        // Metadata (table configs) is rare and must not be lost: write it synchronously.
        wo.set_sync(true);
        self.db
            .put_cf_opt(&cf, key, value, &wo)
            .map_err(backend(format!("put_meta {key}")))
    }

    fn delete_meta(&self, key: &str) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| format!("delete_meta {key}"))?;
        self.check_reserve(|| format!("delete_meta {key}"))?;
        let cf = self.meta_cf()?;
        self.db
            .delete_cf(&cf, key)
            .map_err(backend(format!("delete_meta {key}")))
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let cf = self.meta_cf()?;
        self.db
            .get_cf(&cf, key)
            .map_err(backend(format!("get_meta {key}")))
    }

    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let cf = self.meta_cf()?;
        let mut it = self.db.raw_iterator_cf(&cf);
        it.seek(prefix);
        let mut out = Vec::new();
        while let (Some(key), Some(value)) = (it.key(), it.value()) {
            if !key.starts_with(prefix.as_bytes()) {
                break;
            }
            let key = std::str::from_utf8(key).map_err(|e| StoreError::CorruptMeta {
                key: String::from_utf8_lossy(key).into_owned(),
                detail: format!("key is not utf-8: {e}"),
            })?;
            out.push((key.to_owned(), value.to_vec()));
            it.next();
        }
        it.status()
            .map_err(backend(format!("list_meta {prefix}")))?;
        Ok(out)
    }

    fn estimate_rows(&self, table: u32) -> Result<u64, StoreError> {
        let cf = self.table_cf(table)?;
        let n = self
            .db
            .property_int_value_cf(&cf, "rocksdb.estimate-num-keys")
            .map_err(backend(format!("estimate_rows table {table}")))?;
        Ok(n.unwrap_or(0))
    }

    fn memory_usage(&self) -> StoreMemory {
        let mut m = StoreMemory {
            block_cache: self.cache.get_usage() as u64,
            ..StoreMemory::default()
        };
        for name in self.column_families.lock().iter() {
            let Some(cf) = self.db.cf_handle(name) else {
                continue;
            };
            let prop = |p: &str| self.db.property_int_value_cf(&cf, p).ok().flatten();
            m.memtables += prop("rocksdb.cur-size-all-mem-tables").unwrap_or(0);
            m.table_readers += prop("rocksdb.estimate-table-readers-mem").unwrap_or(0);
        }
        m
    }

    fn checkpoint(&self, dir: &Path) -> Result<(), StoreError> {
        // A memtable flush writes SST files and a new WAL into the database: not into the disk reserve.
        self.check_reserve(|| format!("checkpoint {}", dir.display()))?;
        // Flushes the memtables first (log_size_for_flush = 0 in the crate), so the checkpoint is SST files only.
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(backend(format!("checkpoint {}", dir.display())))
    }

    fn flush(&self) -> Result<(), StoreError> {
        #[cfg(feature = "failpoints")]
        fail_write(|| "flush".into())?;
        self.check_reserve(|| "flush".into())?;
        // Rows are written with the WAL on; syncing the WAL makes every earlier write durable without forcing
        // a memtable flush.
        self.db.flush_wal(true).map_err(backend("flush"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store_conformance::Harness;

    struct RocksHarness(tempfile::TempDir);

    impl Harness for RocksHarness {
        fn open(&mut self) -> Arc<dyn Store> {
            Arc::new(RocksStore::open(self.0.path()).unwrap())
        }
    }

    fn harness() -> RocksHarness {
        RocksHarness(tempfile::tempdir().unwrap())
    }

    crate::store_conformance::store_conformance_tests!(harness());

    #[test]
    fn write_sorted_in_several_files_and_leaves_none_behind() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RocksStore::open(dir.path()).unwrap();
        s.set_ingest_file_bytes(64 << 10);
        s.ensure_table(1).unwrap();
        let row = |id: u64| -> Vec<u8> {
            (0..16u32)
                .flat_map(|k| (id as f32 + k as f32).to_le_bytes())
                .collect()
        };
        // 20,000 rows of 64 bytes: about twenty 64 KiB files, ingested in one go.
        let n = s
            .write_sorted(1, &mut |put| {
                for id in (0..20_000u64).map(|i| i * 3) {
                    put(id, &row(id))?;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(n, 20_000);
        let files = |d: &std::path::Path| std::fs::read_dir(d).map_or(0, |r| r.count());
        assert_eq!(
            files(&dir.path().join(INGEST_DIR)),
            0,
            "files left in the ingest folder"
        );
        let live = s.db.live_files().unwrap();
        assert!(
            live.iter().filter(|f| f.column_family_name == "t1").count() >= 10,
            "{live:?}"
        );
        let mut seen = 0u64;
        s.scan_rows(1, &mut |id, v| {
            assert_eq!(id, seen * 3);
            assert_eq!(v, &row(id)[..]);
            seen += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, 20_000);
        // Point reads find them too (filters and the block hash index of the column family's options).
        let mut found = Vec::new();
        s.get_rows(1, &[3, 4, 59_997], &mut |i, v| {
            found.push((i, v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            found,
            vec![(0, Some(row(3))), (1, None), (2, Some(row(59_997)))]
        );
        // A failed write leaves no file either, and a file left by a process that died mid-write is removed
        // when the store opens.
        assert!(s
            .write_sorted(1, &mut |put| {
                put(1, &row(1))?;
                put(0, &row(0))
            })
            .is_err());
        assert_eq!(files(&dir.path().join(INGEST_DIR)), 0);
        drop(s);
        std::fs::create_dir_all(dir.path().join(INGEST_DIR)).unwrap();
        std::fs::write(dir.path().join(INGEST_DIR).join("t1-0.sst"), b"half").unwrap();
        let s = RocksStore::open(dir.path()).unwrap();
        assert!(!dir.path().join(INGEST_DIR).exists());
        assert_eq!(s.estimate_rows(1).unwrap(), 20_000);
    }

    #[test]
    fn corrupt_key_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path()).unwrap();
        s.ensure_table(2).unwrap();
        let cf = s.table_cf(2).unwrap();
        s.db.put_cf(&cf, [1u8, 2, 3], [0u8; 4]).unwrap();
        drop(cf);
        let e = s.scan_rows(2, &mut |_, _| Ok(())).unwrap_err();
        assert_eq!(e, StoreError::CorruptKey { table: 2, len: 3 });
        assert_eq!(e.to_string(), "table 2: corrupt key of 3 bytes, expected 8");
    }

    #[test]
    fn lists_existing_column_families_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path()).unwrap();
        s.ensure_table(7).unwrap();
        drop(s);
        let names = Db::list_cf(&Options::default(), dir.path()).unwrap();
        assert!(names.contains(&"t7".to_owned()), "{names:?}");
        assert!(names.contains(&"meta".to_owned()), "{names:?}");
        let s = RocksStore::open(dir.path()).unwrap();
        assert!(s.table_cf(7).is_ok());
    }

    #[test]
    fn second_open_of_a_locked_db_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let _s = RocksStore::open(dir.path()).unwrap();
        let e = RocksStore::open(dir.path()).unwrap_err();
        assert!(e.to_string().starts_with("store open "), "{e}");
    }
}
