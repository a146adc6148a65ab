//! A SQLite VFS that loses what was never synced when its process dies: the
//! power-loss tests' stand-in for a disk whose cache is dropped.
//!
//! [`install`] registers the VFS `powerloss` as the process's default, so
//! every connection the process opens afterwards (sqlx's and rusqlite's
//! alike) goes through it without any product code knowing. It wraps the
//! default unix VFS:
//!
//! - a write (`xWrite`) goes to an in-memory overlay of its file, not to the
//!   file: the process's model of the operating system's page cache;
//! - a read (`xRead`) sees the overlay over the real file, and a file's size
//!   (`xFileSize`) counts what the overlay added, so the process reads its
//!   own unsynced writes as it would through the page cache;
//! - a sync (`xSync`) writes the file's overlay to the real file and then
//!   syncs the real file: only then is the data on disk.
//!
//! A crash is then a SIGKILL of the process: its overlays vanish with it,
//! exactly the writes a power loss drops, while everything synced is in the
//! real files. (LazyFS's "clear the page cache" fault, without FUSE.)
//!
//! The overlay belongs to the file (its path), not to one open handle: the
//! read pool's connections read the pages the writer connection wrote, as
//! they would through the one page cache of a real system, and a sync
//! through any handle makes the file's writes durable.
//!
//! Metadata operations are modelled as durable the moment they return:
//! creating a file, deleting one (its overlay is dropped with it) and
//! truncating one. A truncate is a barrier: the file's overlay is written to
//! the real file first, then the real file is truncated. In WAL mode SQLite
//! truncates the database only in a checkpoint, after the WAL it copies
//! from was synced (at NORMAL and FULL), so the barrier makes durable early
//! only pages that the synced WAL holds anyway.
//!
//! Only the main database, its WAL and its rollback journal get overlays;
//! temporary files and the like pass straight through (nothing reads them
//! after a crash).
//!
//! Shared memory (`xShm*`) passes through to the unix VFS: the `-shm` file
//! a killed writer leaves holds a wal-index that may point at WAL frames
//! that were never synced. SQLite never trusts it after a crash: the first
//! connection to open the database takes the exclusive DMS lock on the
//! `-shm` file (nobody else holds a lock: the kernel released the killed
//! process's locks) and truncates it (`unixLockSharedMemory` in the
//! amalgamation's os_unix.c, "this process is the first to open it ...
//! truncate the *-shm file"), so the wal-index header no longer checks out
//! and `walIndexRecover` rebuilds it from the WAL file as it is on disk.
//! (wal.c, SQLite 3.46 as libsqlite3-sys 0.30 bundles it: "The wal-index
//! is transient. After a crash, the wal-index can (and should be)
//! reconstructed from the original WAL file.") The tests must therefore
//! hold no connection of their own open while a writer runs: its lock on
//! the DMS byte would spare the dead writer's wal-index from that
//! truncation, and the next connections would trust it.

use libsqlite3_sys as ffi;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The VFS's name, as `sqlite3_vfs_find` knows it.
pub const VFS_NAME: &str = "powerloss";

/// The overlay's unit: a block is copied from the real file when a write
/// first touches it, so a partial write keeps the bytes around it.
const BLOCK: u64 = 4096;

/// What a process wrote to one file and has not synced.
#[derive(Default)]
struct Overlay {
    blocks: BTreeMap<u64, Box<[u8]>>,
    /// The end of the furthest write since the last flush: the file is at
    /// least this long to its own process.
    end: u64,
}

type SharedOverlay = Arc<Mutex<Overlay>>;

/// The overlays of the process, by the path SQLite opened the file by.
fn overlays() -> MutexGuard<'static, HashMap<String, SharedOverlay>> {
    static OVERLAYS: OnceLock<Mutex<HashMap<String, SharedOverlay>>> = OnceLock::new();
    lock(OVERLAYS.get_or_init(Default::default))
}

/// A panic elsewhere never leaves an overlay half-written (every update
/// completes under the lock or not at all), so a poisoned lock is taken as is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers the `powerloss` VFS as this process's default, once. Every
/// SQLite connection the process opens afterwards loses its unsynced
/// writes when the process is killed. Returns an error when the unix VFS
/// is not there to wrap or SQLite refuses the registration.
pub fn install() -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED.get_or_init(register).clone()
}

/// Whether the process's default VFS is `powerloss` (for the tests that
/// must know their writes go through it).
pub fn is_default() -> bool {
    // SAFETY: a null name asks for the default VFS; the result is a
    // registered VFS, whose name is a NUL-terminated string that lives as
    // long as the registration.
    unsafe {
        let default = ffi::sqlite3_vfs_find(std::ptr::null());
        !default.is_null() && CStr::from_ptr((*default).zName).to_bytes() == VFS_NAME.as_bytes()
    }
}

fn register() -> Result<(), String> {
    // SAFETY: "unix" is a NUL-terminated name; sqlite3_vfs_find initializes
    // SQLite if needed and returns a registered VFS or null.
    let real = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    if real.is_null() {
        return Err("SQLite has no unix VFS to wrap".into());
    }
    // SAFETY: `real` is a registered VFS, which SQLite never frees.
    let real_size = unsafe { (*real).szOsFile };
    let vfs = Box::new(ffi::sqlite3_vfs {
        // Version 2: xCurrentTimeInt64, and no system-call overrides.
        iVersion: 2,
        szOsFile: (std::mem::size_of::<ShimFile>() as c_int) + real_size,
        // SAFETY: as above.
        mxPathname: unsafe { (*real).mxPathname },
        pNext: std::ptr::null_mut(),
        zName: c"powerloss".as_ptr(),
        pAppData: real.cast(),
        xOpen: Some(x_open),
        xDelete: Some(x_delete),
        xAccess: Some(x_access),
        xFullPathname: Some(x_full_pathname),
        xDlOpen: Some(x_dl_open),
        xDlError: Some(x_dl_error),
        xDlSym: Some(x_dl_sym),
        xDlClose: Some(x_dl_close),
        xRandomness: Some(x_randomness),
        xSleep: Some(x_sleep),
        xCurrentTime: Some(x_current_time),
        xGetLastError: Some(x_get_last_error),
        xCurrentTimeInt64: Some(x_current_time_int64),
        xSetSystemCall: None,
        xGetSystemCall: None,
        xNextSystemCall: None,
    });
    // SAFETY: the VFS is leaked, so it outlives every connection; SQLite
    // keeps the pointer and links it into its list (pNext).
    let rc = unsafe { ffi::sqlite3_vfs_register(Box::into_raw(vfs), 1) };
    if rc != ffi::SQLITE_OK {
        return Err(format!("sqlite3_vfs_register refused the powerloss VFS: {rc}"));
    }
    Ok(())
}

/// An open file of this VFS. SQLite allocates `szOsFile` bytes for it: this
/// header, then the unix VFS's own file, which `real` points at.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// `Arc::into_raw` of the file's overlay, or null for a file that
    /// passes straight through.
    overlay: *const Mutex<Overlay>,
}

/// The unix VFS this one wraps.
///
/// # Safety
/// `vfs` is the powerloss VFS, whose `pAppData` is the unix VFS.
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    (*vfs).pAppData.cast()
}

/// The file's unix file and its overlay.
///
/// # Safety
/// `file` is a `ShimFile` that `x_open` opened and `x_close` has not closed.
unsafe fn parts<'a>(file: *mut ffi::sqlite3_file) -> (*mut ffi::sqlite3_file, Option<&'a Mutex<Overlay>>) {
    let shim = file.cast::<ShimFile>();
    ((*shim).real, (*shim).overlay.as_ref())
}

/// The unix file's methods.
///
/// # Safety
/// `real` is an open unix file.
unsafe fn methods<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    &*(*real).pMethods
}

// SAFETY (every `x_*` method of a file below): SQLite calls each with a
// file `x_open` opened (its pMethods is METHODS) and has not closed, from
// one thread at a time per file, with buffers as long as the amounts it
// names; each hands the unix file to the unix VFS's method of the same
// name under the same contract. Overlays shared between files are only
// touched under their mutex.
static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 2: shared memory (WAL), and no xFetch, so SQLite never maps
    // the real file into memory and reads around the overlay.
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// SQLite's file name as the overlays' key.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn key(name: *const c_char) -> Option<String> {
    (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
}

// SAFETY (`x_open`, `x_delete` and the rest of the VFS's methods): SQLite
// calls them with this VFS (whose pAppData is the unix VFS), NUL-terminated
// names, and, for `x_open`, a file of `szOsFile` bytes: the `ShimFile`
// header, then room for the unix file.
unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let shim = file.cast::<ShimFile>();
    let real = file
        .cast::<u8>()
        .add(std::mem::size_of::<ShimFile>())
        .cast::<ffi::sqlite3_file>();
    // SQLite calls xClose only on a file whose pMethods is set.
    (*shim).base.pMethods = std::ptr::null();
    let rc = ((*real_vfs(vfs)).xOpen.expect("the unix VFS opens files"))(real_vfs(vfs), name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let durable_kinds = ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_MAIN_JOURNAL;
    let overlay = match key(name) {
        Some(path) if flags & durable_kinds != 0 => Arc::into_raw(overlays().entry(path).or_default().clone()),
        _ => std::ptr::null(),
    };
    (*shim).real = real;
    (*shim).overlay = overlay;
    (*shim).base.pMethods = &METHODS;
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_delete(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
    // A deleted file's unsynced writes go with it (a handle still open on
    // it keeps the emptied overlay until it closes).
    if let Some(path) = key(name) {
        if let Some(overlay) = overlays().remove(&path) {
            *lock(&overlay) = Overlay::default();
        }
    }
    ((*real_vfs(vfs)).xDelete.expect("the unix VFS deletes files"))(real_vfs(vfs), name, sync_dir)
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let shim = file.cast::<ShimFile>();
    let (real, _) = parts(file);
    // Closing is not syncing: the overlay stays in the process's map, as
    // a closed file's dirty pages stay in the page cache.
    if !(*shim).overlay.is_null() {
        drop(Arc::from_raw((*shim).overlay));
        (*shim).overlay = std::ptr::null();
    }
    let rc = (methods(real).xClose.expect("unix files close"))(real);
    (*shim).base.pMethods = std::ptr::null();
    rc
}

/// The file's size on disk.
///
/// # Safety
/// `real` is an open unix file.
unsafe fn real_size(real: *mut ffi::sqlite3_file) -> Result<u64, c_int> {
    let mut size: ffi::sqlite3_int64 = 0;
    match (methods(real).xFileSize.expect("unix files have sizes"))(real, &mut size) {
        ffi::SQLITE_OK => Ok(size as u64),
        rc => Err(rc),
    }
}

/// Reads from the real file; beyond its end the buffer is zeros (the unix
/// VFS fills them), which is what the caller wants here.
///
/// # Safety
/// `real` is an open unix file and `buffer` holds `length` bytes.
unsafe fn read_real(real: *mut ffi::sqlite3_file, buffer: *mut u8, length: u64, offset: u64) -> c_int {
    match (methods(real).xRead.expect("unix files read"))(real, buffer.cast(), length as c_int, offset as i64) {
        ffi::SQLITE_IOERR_SHORT_READ => ffi::SQLITE_OK,
        rc => rc,
    }
}

unsafe extern "C" fn x_read(file: *mut ffi::sqlite3_file, buffer: *mut c_void, amount: c_int, offset: i64) -> c_int {
    let (real, overlay) = parts(file);
    let Some(overlay) = overlay else {
        return (methods(real).xRead.expect("unix files read"))(real, buffer, amount, offset);
    };
    let overlay = lock(overlay);
    if overlay.blocks.is_empty() {
        return (methods(real).xRead.expect("unix files read"))(real, buffer, amount, offset);
    }
    let (start, length, buffer) = (offset as u64, amount as u64, buffer.cast::<u8>());
    let size = match real_size(real) {
        Ok(size) => size.max(overlay.end),
        Err(rc) => return rc,
    };
    let mut done = 0;
    while done < length {
        let at = start + done;
        let block = at / BLOCK;
        let within = at % BLOCK;
        let take = (BLOCK - within).min(length - done);
        match overlay.blocks.get(&block) {
            Some(bytes) => std::ptr::copy_nonoverlapping(
                bytes[within as usize..].as_ptr(),
                buffer.add(done as usize),
                take as usize,
            ),
            None => {
                let rc = read_real(real, buffer.add(done as usize), take, at);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
            }
        }
        done += take;
    }
    if start + length > size {
        // Past the end the file has to its process: zeros, and a short read.
        let valid = size.saturating_sub(start).min(length);
        std::ptr::write_bytes(buffer.add(valid as usize), 0, (length - valid) as usize);
        return ffi::SQLITE_IOERR_SHORT_READ;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_write(file: *mut ffi::sqlite3_file, buffer: *const c_void, amount: c_int, offset: i64) -> c_int {
    let (real, overlay) = parts(file);
    let Some(overlay) = overlay else {
        return (methods(real).xWrite.expect("unix files write"))(real, buffer, amount, offset);
    };
    let mut overlay = lock(overlay);
    let (start, length, buffer) = (offset as u64, amount as u64, buffer.cast::<u8>());
    let mut done = 0;
    while done < length {
        let at = start + done;
        let block = at / BLOCK;
        let within = at % BLOCK;
        let take = (BLOCK - within).min(length - done);
        let bytes = match overlay.blocks.entry(block) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let mut bytes = vec![0u8; BLOCK as usize].into_boxed_slice();
                let rc = read_real(real, bytes.as_mut_ptr(), BLOCK, block * BLOCK);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                entry.insert(bytes)
            }
        };
        std::ptr::copy_nonoverlapping(
            buffer.add(done as usize),
            bytes[within as usize..].as_mut_ptr(),
            take as usize,
        );
        done += take;
    }
    overlay.end = overlay.end.max(start + length);
    ffi::SQLITE_OK
}

/// Writes the overlay to the real file (without syncing it) and empties it.
/// The last block is written only as far as the file reaches, so a flush
/// never lengthens the file beyond what its process saw.
///
/// # Safety
/// `real` is an open unix file.
unsafe fn flush(real: *mut ffi::sqlite3_file, overlay: &mut Overlay) -> c_int {
    if overlay.blocks.is_empty() {
        return ffi::SQLITE_OK;
    }
    let size = match real_size(real) {
        Ok(size) => size.max(overlay.end),
        Err(rc) => return rc,
    };
    for (block, bytes) in &overlay.blocks {
        let at = block * BLOCK;
        let length = BLOCK.min(size.saturating_sub(at));
        if length == 0 {
            continue;
        }
        let rc =
            (methods(real).xWrite.expect("unix files write"))(real, bytes.as_ptr().cast(), length as c_int, at as i64);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    *overlay = Overlay::default();
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let (real, overlay) = parts(file);
    if let Some(overlay) = overlay {
        let rc = flush(real, &mut lock(overlay));
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    (methods(real).xTruncate.expect("unix files truncate"))(real, size)
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let (real, overlay) = parts(file);
    if let Some(overlay) = overlay {
        let rc = flush(real, &mut lock(overlay));
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    (methods(real).xSync.expect("unix files sync"))(real, flags)
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let (real, overlay) = parts(file);
    let on_disk = match real_size(real) {
        Ok(on_disk) => on_disk,
        Err(rc) => return rc,
    };
    let end = overlay.map_or(0, |overlay| lock(overlay).end);
    *size = on_disk.max(end) as i64;
    ffi::SQLITE_OK
}

// Locks, file controls, the device's properties and shared memory are the
// unix VFS's own.

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xLock.expect("unix files lock"))(real, level)
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xUnlock.expect("unix files unlock"))(real, level)
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xCheckReservedLock.expect("unix files lock"))(real, out)
}

unsafe extern "C" fn x_file_control(file: *mut ffi::sqlite3_file, op: c_int, argument: *mut c_void) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xFileControl.expect("unix files take controls"))(real, op, argument)
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xSectorSize.expect("unix files have sectors"))(real)
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, _) = parts(file);
    (methods(real)
        .xDeviceCharacteristics
        .expect("unix files describe their device"))(real)
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xShmMap.expect("unix files share memory"))(real, region, size, extend, out)
}

unsafe extern "C" fn x_shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, count: c_int, flags: c_int) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xShmLock.expect("unix files share memory"))(real, offset, count, flags)
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    let (real, _) = parts(file);
    (methods(real).xShmBarrier.expect("unix files share memory"))(real)
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let (real, _) = parts(file);
    (methods(real).xShmUnmap.expect("unix files share memory"))(real, delete)
}

// The rest of the VFS is the unix VFS's, called with itself.

unsafe extern "C" fn x_access(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, flags: c_int, out: *mut c_int) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xAccess.expect("unix VFS"))(real, name, flags, out)
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    length: c_int,
    out: *mut c_char,
) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xFullPathname.expect("unix VFS"))(real, name, length, out)
}

unsafe extern "C" fn x_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    let real = real_vfs(vfs);
    ((*real).xDlOpen.expect("unix VFS"))(real, name)
}

unsafe extern "C" fn x_dl_error(vfs: *mut ffi::sqlite3_vfs, length: c_int, out: *mut c_char) {
    let real = real_vfs(vfs);
    ((*real).xDlError.expect("unix VFS"))(real, length, out)
}

type Symbol = unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char);

unsafe extern "C" fn x_dl_sym(
    vfs: *mut ffi::sqlite3_vfs,
    handle: *mut c_void,
    symbol: *const c_char,
) -> Option<Symbol> {
    let real = real_vfs(vfs);
    ((*real).xDlSym.expect("unix VFS"))(real, handle, symbol)
}

unsafe extern "C" fn x_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    let real = real_vfs(vfs);
    ((*real).xDlClose.expect("unix VFS"))(real, handle)
}

unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, length: c_int, out: *mut c_char) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xRandomness.expect("unix VFS"))(real, length, out)
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, microseconds: c_int) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xSleep.expect("unix VFS"))(real, microseconds)
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xCurrentTime.expect("unix VFS"))(real, out)
}

unsafe extern "C" fn x_get_last_error(vfs: *mut ffi::sqlite3_vfs, length: c_int, out: *mut c_char) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xGetLastError.expect("unix VFS"))(real, length, out)
}

unsafe extern "C" fn x_current_time_int64(vfs: *mut ffi::sqlite3_vfs, out: *mut ffi::sqlite3_int64) -> c_int {
    let real = real_vfs(vfs);
    ((*real).xCurrentTimeInt64.expect("unix VFS"))(real, out)
}
