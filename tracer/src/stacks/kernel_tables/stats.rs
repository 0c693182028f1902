//! The tables' counts: what did not fit, what was built, reused and
//! evicted (`TableStats`), and their footprint now (`TablesInUse`).

/// Counts for `--verbose` and the report's notes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Files with a table in UNWIND_ROWS now.
    pub files: u64,
    pub rows_used: u64,
    pub rows_capacity: u64,
    /// Times a process began to use a file whose table could not be
    /// loaded for lack of rows (its frames in that file follow the
    /// frame-pointer chain instead): raise --unwind-rows. A file counts
    /// once per process that maps it while it does not fit; a trampoline
    /// shape once per read of the maps that found no rows for it.
    pub rows_full: u64,
    /// Of `rows_full`: those that would have fit by evicting kept tables
    /// used in the last RECENTLY_USED (kept, so as not to thrash).
    pub kept_out_recent: u64,
    /// Of `rows_full`: those not even built, their row count known from
    /// an earlier build of the same file (evicted, or did not fit).
    pub not_rebuilt: u64,
    /// Tables loaded for files already in use without one, once their
    /// rows could be had.
    pub loaded_late: u64,
    /// Trampoline shapes with a table in UNWIND_ROWS now (their rows are
    /// in `rows_used`).
    pub trampoline_tables: u64,
    /// Files without a usable table: no CFI, malformed or oversized CFI.
    pub table_errors: u64,
    /// Mappings UNWIND_MAPPINGS had no room for.
    pub mappings_full: u64,
    /// Rows the walker cannot follow (CFA from another register, ...), in
    /// the tables loaded: a stack through one ends there, counted.
    pub unsupported_rows: u64,
    /// Tables built and rows written, and the time spent building and
    /// writing them.
    pub tables_built: u64,
    pub rows_written: u64,
    pub build_nanos: u64,
    /// Kept tables (of files no process used any more) taken again as
    /// they were, instead of built again.
    pub reused: u64,
    /// Kept tables dropped for the rows of a new one (oldest unused
    /// first, none used in the last RECENTLY_USED) or beyond
    /// MAX_UNUSED_FILES, and after UNUSED_TABLE_TTL.
    pub evicted: u64,
    pub expired: u64,
}
/// The tables' footprint now: rows in UNWIND_ROWS (8 bytes each) for
/// `files` files, of which `kept_files` with `kept_rows` rows are kept for
/// files no process maps now; trie entries in UNWIND_MAPPINGS for
/// `processes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesInUse {
    pub files: u64,
    pub rows: u64,
    pub kept_files: u64,
    pub kept_rows: u64,
    pub mappings: u64,
    pub processes: u64,
}
