//! Survives a mapped file shrinking under its reader.
//!
//! Touching a page of a shared file mapping that lies past the file's current end raises
//! SIGBUS, which kills the process. A mapping is registered here while it is read; the
//! handler installed here replaces the rest of a registered window from the faulting page
//! on with anonymous zero pages, marks the window, and returns, so the access is retried
//! and reads zeroes. The reader then sees the mark and fails instead of using what it
//! computed. A fault outside every registered window goes to the handler that was there
//! before (the standard library's, or the default action).
//!
//! The handler only loads and stores atomics and calls mmap, which are safe in a signal
//! handler on Linux.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Windows registered at once; a reader that finds none free reads the other way.
const SLOTS: usize = 64;

struct Slot {
    /// Window start address; 0 while the slot is free or being filled.
    start: AtomicUsize,
    end: AtomicUsize,
    /// Taken by a reader (`start` may still be 0 while it is filled in).
    taken: AtomicBool,
    /// The file shrank under this window.
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    taken: AtomicBool::new(false),
    hit: AtomicBool::new(false),
};

static WINDOWS: [Slot; SLOTS] = [FREE; SLOTS];
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The handler that was installed before ours, for faults that are not ours.
static mut PREVIOUS: Option<libc::sigaction> = None;

/// A registered window; unregistered when dropped.
pub(crate) struct Window {
    slot: &'static Slot,
}

impl Window {
    /// Registers `start..start + len` (page-aligned), or None if the handler cannot be
    /// installed or every slot is taken.
    pub(crate) fn register(start: usize, len: usize) -> Option<Self> {
        install();
        if !INSTALLED.load(Ordering::Acquire) {
            return None;
        }
        let slot = WINDOWS.iter().find(|s| {
            s.taken
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        slot.hit.store(false, Ordering::Relaxed);
        slot.end.store(start + len, Ordering::Relaxed);
        slot.start.store(start, Ordering::Release);
        Some(Self { slot })
    }

    /// Whether the file shrank under the window: part of it read as zeroes.
    pub(crate) fn hit(&self) -> bool {
        self.slot.hit.load(Ordering::Acquire)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.slot.start.store(0, Ordering::Release);
        self.slot.taken.store(false, Ordering::Release);
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    install();
    PAGE.load(Ordering::Relaxed)
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: a zeroed sigaction is a valid value to fill in; `handler` has the
        // SA_SIGINFO signature; PREVIOUS is written once, here, before the handler that
        // reads it is installed, and never again.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return;
            }
            *std::ptr::addr_of_mut!(PREVIOUS) = Some(previous);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for slot in &WINDOWS {
        let start = slot.start.load(Ordering::Acquire);
        let end = slot.end.load(Ordering::Relaxed);
        if start != 0 && (start..end).contains(&addr) {
            let from = addr & !(page - 1);
            // SAFETY: from..end lies in the registered window, a mapping its reader owns
            // until it unregisters and unmaps it; replacing it with zero pages changes
            // only what the reader sees, which it then discards because of the mark.
            let mapped = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    end - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if mapped != libc::MAP_FAILED {
                slot.hit.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not ours: hand it on as if we were not here.
    // SAFETY: PREVIOUS was written before this handler was installed and not since.
    let previous = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match previous {
        Some(previous)
            if previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN =>
        {
            // SAFETY: the previous handler was installed with these flags, so it has
            // the matching signature.
            unsafe {
                if previous.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(previous.sa_sigaction);
                    f(sig, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(previous.sa_sigaction);
                    f(sig);
                }
            }
        }
        _ => {
            // The default action: restore it and return, so the fault repeats and kills
            // the process as it would have without us.
            // SAFETY: a zeroed sigaction with SIG_DFL is valid.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
            }
        }
    }
}
