//! The open-object table: one entry per mapped file, shared by every
//! process that maps it, kept open so that it can be read after those
//! processes exited or the file was replaced on disk.
//!
//! An object is counted once per process that maps it (`retain`,
//! `release`) and marked when an interned frame refers to it
//! (`reference`); it is evicted, its file closed and its slot reused, when
//! neither holds it. Bounded by the files that live processes map plus
//! those that interned frames name.
//!
//! ```ignore
//! let mut table = ObjectTable::default();
//! let i = table.identify(pid, &mapping); // opened once per file
//! table.retain(i);                        // one process maps it
//! table.release(i);                       // evicted: nothing holds it
//! ```

use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use super::super::{
    debug_files::DebugInfo,
    roots::{open_in_root, open_mapped, path_in_root, Root, Roots},
};
use crate::tracee::process::Mapping;

/// Which file an object is: the same (device, inode) in every process that
/// maps it, whatever path or mount namespace it is seen through. A file
/// that could not be opened is known by its path only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ObjectKey {
    File { dev: u64, ino: u64 },
    Unopened(String),
}

/// A mapped object file.
struct Object {
    key: ObjectKey,
    /// Path as the first process that mapped it saw it.
    path: String,
    file: Option<File>,
    /// Live processes that map it.
    users: u32,
    /// An interned frame refers to it: kept until the report.
    referenced: bool,
    /// The root of the first process that mapped it (None: ours), and
    /// `path` as seen inside it: where its debug files are looked for.
    root: Root,
    path_in_root: String,
    /// Build id and debug file, read the first time a frame is named.
    debug: OnceLock<DebugInfo>,
    /// (device, inode) as the maps of the process it was opened for show
    /// it, when it was opened through /proc/PID/map_files and its fstat
    /// gives the same (`maps_form`): its entry in `by_maps_id`.
    maps_id: Option<(u64, u64)>,
}

#[derive(Default)]
pub struct ObjectTable {
    /// Slots freed by eviction are None and reused.
    objects: Vec<Option<Object>>,
    free: Vec<u32>,
    by_key: HashMap<ObjectKey, u32>,
    /// Objects by the (device, inode) that /proc/PID/maps shows for them,
    /// so that another process mapping the same file costs no open and no
    /// stat. Sound because the object holds the file open: its inode
    /// cannot be freed and its number reused while the entry lives. At
    /// most one entry per object, removed when the object is evicted.
    by_maps_id: HashMap<(u64, u64), u32>,
    /// Processes' root directories, shared by the objects seen in them.
    roots: Roots,
}

/// A path that opens the very file `file` has open.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The key of a file whose fstat gave `meta` (None: not opened), mapped
/// at `path`.
fn key_of(meta: Option<&std::fs::Metadata>, path: &str) -> ObjectKey {
    match meta {
        Some(meta) => ObjectKey::File {
            dev: meta.dev(),
            ino: meta.ino(),
        },
        None => ObjectKey::Unopened(path.to_string()),
    }
}

/// A file's (device, inode) as /proc/PID/maps would show them: the kernel
/// prints MAJOR:MINOR of the device, read back as major << 32 | minor
/// (`process::parse_dev`); stat gives the device encoded otherwise.
fn maps_form(meta: &std::fs::Metadata) -> (u64, u64) {
    let dev = meta.dev();
    (
        u64::from(libc::major(dev)) << 32 | u64::from(libc::minor(dev)),
        meta.ino(),
    )
}

impl ObjectTable {
    /// The object a mapping of `pid` shows: found by the maps' (device,
    /// inode) if another process's mapping opened it already, else opened
    /// through /proc/PID/map_files (the very file mapped, even if deleted
    /// or replaced since), else through the process's root.
    pub fn identify(&mut self, pid: u32, m: &Mapping) -> u32 {
        let maps_id = Some(m.dev_inode).filter(|&(_, inode)| inode != 0);
        if let Some(&i) = maps_id.and_then(|id| self.by_maps_id.get(&id)) {
            return i;
        }
        // Both opens refuse what is not a regular file (a device mapped, a
        // FIFO put where a mapped file was) before opening it, and the
        // path the maps show is resolved inside the process's root.
        let mapped = open_mapped(
            Path::new(&format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
            u64::MAX,
        );
        let very_file = mapped.is_ok();
        let mut rooted = None;
        let file = match mapped {
            Ok(file) => Some(file),
            Err(_) => {
                let (root, prefix) = self.roots.of(pid);
                let at = path_in_root(&m.path, &prefix);
                let file = open_in_root(root.as_deref(), Path::new(&at), u64::MAX).ok();
                rooted = Some((root, prefix));
                file
            }
        };
        let meta = file.as_ref().and_then(|f| f.metadata().ok());
        // Only the very file mapped may be found again by the maps' id, and
        // only where that id is its own: btrfs shows the filesystem's
        // device for every subvolume, whose inode numbers repeat, so there
        // two files share an id and each is identified by its fstat.
        let maps_id = maps_id
            .filter(|&id| very_file && meta.as_ref().is_some_and(|meta| maps_form(meta) == id));
        let key = key_of(meta.as_ref(), &m.path);
        if let Some(i) = self.found(&key, maps_id) {
            return i; // the file opened now closes here
        }
        let (root, prefix) = rooted.unwrap_or_else(|| self.roots.of(pid));
        self.insert(Object {
            key,
            path: m.path.clone(),
            file,
            users: 0,
            referenced: false,
            root,
            path_in_root: path_in_root(&m.path, &prefix),
            debug: OnceLock::new(),
            maps_id,
        })
    }

    /// The object held for `key`, which the maps' (device, inode)
    /// `maps_id` will find from now on if none did.
    fn found(&mut self, key: &ObjectKey, maps_id: Option<(u64, u64)>) -> Option<u32> {
        let &i = self.by_key.get(key)?;
        if let (Some(id), Some(Some(o))) = (maps_id, self.objects.get_mut(i as usize)) {
            if o.maps_id.is_none() && o.file.is_some() {
                o.maps_id = Some(id);
                self.by_maps_id.insert(id, i);
            }
        }
        Some(i)
    }

    /// Holds a new object in a free slot (or a new one).
    fn insert(&mut self, object: Object) -> u32 {
        let (key, maps_id) = (object.key.clone(), object.maps_id);
        let i = match self.free.pop() {
            Some(i) => {
                self.objects[i as usize] = Some(object);
                i
            }
            None => {
                self.objects.push(Some(object));
                (self.objects.len() - 1) as u32
            }
        };
        if let Some(id) = maps_id {
            self.by_maps_id.insert(id, i);
        }
        self.by_key.insert(key, i);
        i
    }

    /// One more live process maps object `i`.
    pub fn retain(&mut self, i: u32) {
        if let Some(Some(o)) = self.objects.get_mut(i as usize) {
            o.users += 1;
        }
    }

    /// One process less maps object `i`: evicted (its file closed) when no
    /// live process maps it and no interned frame refers to it.
    pub fn release(&mut self, i: u32) {
        let Some(slot) = self.objects.get_mut(i as usize) else {
            return;
        };
        let Some(o) = slot else {
            return;
        };
        o.users = o.users.saturating_sub(1);
        if o.users == 0 && !o.referenced {
            self.by_key.remove(&o.key);
            if let Some(id) = o.maps_id {
                self.by_maps_id.remove(&id);
            }
            *slot = None;
            self.free.push(i);
        }
    }

    /// An interned frame refers to object `i`: kept until the report.
    pub fn reference(&mut self, i: u32) {
        if let Some(Some(o)) = self.objects.get_mut(i as usize) {
            o.referenced = true;
        }
    }

    /// How many objects are found by the maps' (device, inode).
    #[cfg(test)]
    pub fn found_by_maps_id(&self) -> usize {
        self.by_maps_id.len()
    }

    /// How many objects are held.
    pub fn held(&self) -> usize {
        self.by_key.len()
    }

    /// The path of object `i` as the first process that mapped it saw it.
    pub fn path(&self, i: u32) -> Option<&str> {
        Some(self.objects.get(i as usize)?.as_ref()?.path.as_str())
    }

    /// The path of the object that is the file (`dev`, `ino`), if held.
    pub fn path_of_file(&self, dev: u64, ino: u64) -> Option<&str> {
        let &i = self.by_key.get(&ObjectKey::File { dev, ino })?;
        self.path(i)
    }

    /// Object `i`'s file identity and a path to the copy held open here
    /// (None when its file was not opened).
    pub fn open_file(&self, i: u32) -> Option<((u64, u64), PathBuf)> {
        match self.objects.get(i as usize) {
            Some(Some(Object {
                key: ObjectKey::File { dev, ino },
                file: Some(file),
                ..
            })) => Some(((*dev, *ino), fd_path(file))),
            _ => None,
        }
    }

    /// A path that opens object `i`'s file as held here.
    pub fn open_path(&self, i: u32) -> Option<PathBuf> {
        let o = self.objects.get(i as usize)?.as_ref()?;
        Some(fd_path(o.file.as_ref()?))
    }

    /// The build id and debug file of object `i`, read on first use (None
    /// when the object was not opened).
    pub fn debug_info(&self, i: u32) -> Option<&DebugInfo> {
        let o = self.objects.get(i as usize)?.as_ref()?;
        let file = o.file.as_ref()?;
        Some(
            o.debug
                .get_or_init(|| DebugInfo::read(file, o.root.as_deref(), &o.path_in_root)),
        )
    }

    /// How many objects whose debug information was read have a refused
    /// debug link, and one as "path: link" (escaped).
    pub fn refused_debug_links(&self) -> (u64, Option<String>) {
        let mut refused = self.objects.iter().flatten().filter_map(|o| {
            let link = o.debug.get()?.refused_link.as_deref()?;
            Some((o.path.as_str(), link))
        });
        let Some((path, link)) = refused.next() else {
            return (0, None);
        };
        let example = format!("{}: {link}", crate::escape::text(path));
        (1 + refused.count() as u64, Some(example))
    }
}

#[cfg(test)]
mod tests;
