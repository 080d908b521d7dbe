//! Every `unsafe` block of the crate: thin wrappers over the syscalls
//! (socket options, mmap, bind, sendto, bpf) and the accessors of shared
//! memory mappings. Everything outside this module is safe code.
//!
//! The uapi structures are declared here rather than taken from `libc` so that
//! their layout is visible next to the calls that depend on it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

pub(crate) mod tun;

// ===== uapi constants =====

/// `AF_XDP` address family.
pub(crate) const AF_XDP: libc::c_int = 44;
/// `SOL_XDP` socket option level.
pub(crate) const SOL_XDP: libc::c_int = 283;
pub(crate) const XDP_MMAP_OFFSETS: libc::c_int = 1;
pub(crate) const XDP_RX_RING: libc::c_int = 2;
pub(crate) const XDP_TX_RING: libc::c_int = 3;
pub(crate) const XDP_UMEM_REG: libc::c_int = 4;
pub(crate) const XDP_UMEM_FILL_RING: libc::c_int = 5;
pub(crate) const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
pub(crate) const XDP_STATISTICS: libc::c_int = 7;
pub(crate) const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

pub(crate) const XDP_SHARED_UMEM: u16 = 1 << 0;
pub(crate) const XDP_COPY: u16 = 1 << 1;
pub(crate) const XDP_ZEROCOPY: u16 = 1 << 2;
pub(crate) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;

pub(crate) const XDP_RING_NEED_WAKEUP: u32 = 1;

pub(crate) const XDP_PGOFF_RX_RING: libc::off_t = 0;
pub(crate) const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
pub(crate) const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
pub(crate) const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;

pub(crate) const SO_BUSY_POLL: libc::c_int = 46;
pub(crate) const SO_PREFER_BUSY_POLL: libc::c_int = 69;
pub(crate) const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

pub(crate) const SOL_PACKET: libc::c_int = 263;
pub(crate) const PACKET_RX_RING: libc::c_int = 5;
pub(crate) const PACKET_STATISTICS: libc::c_int = 6;
pub(crate) const PACKET_VERSION: libc::c_int = 10;
pub(crate) const PACKET_TX_RING: libc::c_int = 13;
pub(crate) const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
pub(crate) const TPACKET_V2: libc::c_int = 1;
pub(crate) const ETH_P_ALL: u16 = 0x0003;

// ===== uapi structures =====

/// `struct xdp_umem_reg` (with `tx_metadata_len`, kernel 6.8+; older kernels
/// accept the shorter prefix, and we pass zero there).
#[repr(C)]
#[derive(Default)]
pub(crate) struct XdpUmemReg {
    pub addr: u64,
    pub len: u64,
    pub chunk_size: u32,
    pub headroom: u32,
    pub flags: u32,
    pub tx_metadata_len: u32,
}

/// `struct xdp_ring_offset`.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct XdpRingOffset {
    pub producer: u64,
    pub consumer: u64,
    pub desc: u64,
    pub flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct XdpMmapOffsets {
    pub rx: XdpRingOffset,
    pub tx: XdpRingOffset,
    pub fr: XdpRingOffset,
    pub cr: XdpRingOffset,
}

/// `struct sockaddr_xdp`.
#[repr(C)]
pub(crate) struct SockaddrXdp {
    pub family: u16,
    pub flags: u16,
    pub ifindex: u32,
    pub queue_id: u32,
    pub shared_umem_fd: u32,
}

/// `struct xdp_statistics`.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct XdpStatistics {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// `struct tpacket_req`.
#[repr(C)]
pub(crate) struct TpacketReq {
    pub block_size: u32,
    pub block_nr: u32,
    pub frame_size: u32,
    pub frame_nr: u32,
}

/// `struct tpacket_stats`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct TpacketStats {
    pub packets: u32,
    pub drops: u32,
}

/// Marker for plain-old-data uapi structures: every bit pattern is valid and
/// they contain no pointers Rust cares about, so the kernel may write them.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integers.
pub(crate) unsafe trait Pod: Default {}
// SAFETY: repr(C) structs of integers only.
unsafe impl Pod for XdpMmapOffsets {}
// SAFETY: repr(C) structs of integers only.
unsafe impl Pod for XdpStatistics {}
// SAFETY: repr(C) structs of integers only.
unsafe impl Pod for TpacketStats {}
// SAFETY: an integer.
unsafe impl Pod for u32 {}
// SAFETY: an integer.
unsafe impl Pod for i32 {}

// ===== syscalls =====

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `socket(domain, type | SOCK_CLOEXEC, protocol)`.
pub(crate) fn socket(
    domain: libc::c_int,
    ty: libc::c_int,
    protocol: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; the returned descriptor is fresh and
    // owned by nobody else, so OwnedFd may take it.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: see above: `fd` is a new, valid descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt` with a value of any plain type.
pub(crate) fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, which lives for the
    // call; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `getsockopt` into a plain-old-data value.
pub(crate) fn getsockopt<T: Pod>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`, a Pod type
    // for which any bytes are valid, and updates `len`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// `bind` to an AF_XDP address.
pub(crate) fn bind_xdp(fd: BorrowedFd<'_>, addr: &SockaddrXdp) -> io::Result<()> {
    // SAFETY: the pointer and length describe `addr`, which lives for the call.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (addr as *const SockaddrXdp).cast(),
            std::mem::size_of::<SockaddrXdp>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `bind` an AF_PACKET socket to an interface, all protocols.
pub(crate) fn bind_packet(fd: BorrowedFd<'_>, ifindex: u32) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: the pointer and length describe `sll`, alive for the call.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `sendto(fd, NULL, 0, MSG_DONTWAIT)`: the TX wake-up of AF_XDP and
/// PACKET_MMAP rings.
pub(crate) fn send_kick(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a zero-length send with null buffer and address reads nothing.
    let ret = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`: the RX (fill ring) wake-up.
pub(crate) fn recv_kick(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a zero-length receive into a null buffer writes nothing.
    let ret = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `poll` one descriptor for `events`; returns whether it became ready.
pub(crate) fn poll_one(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: i32,
) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the call.
    let n = cvt(unsafe { libc::poll(&mut pfd, 1, timeout_ms) })?;
    Ok(n > 0)
}

/// `if_nametoindex`.
pub(crate) fn if_nametoindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string alive for the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(index)
    }
}

/// The soft and hard `RLIMIT_MEMLOCK`, in bytes.
pub(crate) fn memlock_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if ret < 0 {
        return (u64::MAX, u64::MAX);
    }
    (lim.rlim_cur, lim.rlim_max)
}

// ===== shared memory mappings =====

/// A shared memory mapping (the UMEM, a ring, a PACKET_MMAP ring), unmapped
/// on drop.
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access from safe code goes
// through `&self`/`&mut self` methods below, with atomics where the kernel
// is a concurrent party.
unsafe impl Send for Mmap {}
// SAFETY: see above; shared (`&self`) accesses are atomic loads/stores or
// reads of entries the ring protocol has handed to this side.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Anonymous, shared, populated memory (the UMEM).
    pub(crate) fn anonymous(len: usize) -> io::Result<Mmap> {
        // SAFETY: a new anonymous mapping aliases nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        Self::from_raw(ptr, len)
    }

    /// A mapping of a socket's ring at page offset `offset`.
    pub(crate) fn socket_ring(
        fd: BorrowedFd<'_>,
        len: usize,
        offset: libc::off_t,
    ) -> io::Result<Mmap> {
        // SAFETY: the kernel chooses the address; the mapping aliases only
        // memory shared with the kernel, which is the point.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                offset,
            )
        };
        Self::from_raw(ptr, len)
    }

    fn from_raw(ptr: *mut libc::c_void, len: usize) -> io::Result<Mmap> {
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Mmap { ptr, len })
    }

    /// Start address (for XDP_UMEM_REG).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The whole mapping as bytes.
    ///
    /// The kernel writes into frames it owns (fill ring → RX ring) while this
    /// slice exists; the ring protocol keeps the caller from reading those.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live mapping owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole mapping as writable bytes, through a shared `Mmap`.
    ///
    /// Only [`crate::Umem::as_mut_slice`] calls this, from `&mut Umem`; the
    /// other holders of the UMEM's `Arc<Mmap>` (`UmemHandle`) only read its
    /// address, never its bytes. Parts made by [`crate::Umem::split`] each
    /// write only the chunks their owner holds, as the kernel writes only
    /// the chunks on its rings, so no byte is written through two of them.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn as_mut_slice_exclusive(&self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is a live mapping owned by self. By the
        // contract above, the only other writers are the kernel (chunks on
        // its rings) and other `Umem::split` parts (chunks their owner
        // holds), and no chunk is held by two owners at once, so no byte is
        // accessed through two references concurrently.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn check(&self, offset: usize, size: usize, align: usize) {
        assert!(
            offset.checked_add(size).is_some_and(|end| end <= self.len)
                && (self.addr() as usize + offset).is_multiple_of(align),
            "mapping access out of bounds or misaligned"
        );
    }

    /// The `u32` at `offset`, as an atomic (ring producer, consumer, flags,
    /// PACKET_MMAP frame status).
    ///
    /// # Panics
    /// If `offset` is out of bounds or not 4-byte aligned.
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4, 4);
        // SAFETY: in bounds and aligned (checked); AtomicU32 has the layout of
        // u32 and every bit pattern is valid; the memory lives as long as self.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    /// Reads a plain `u64` at `offset` (a ring entry owned by this side).
    pub(crate) fn read_u64(&self, offset: usize) -> u64 {
        self.check(offset, 8, 8);
        // SAFETY: in bounds and aligned (checked).
        unsafe { self.ptr.as_ptr().add(offset).cast::<u64>().read_volatile() }
    }

    /// Reads a plain `u32` at `offset`.
    pub(crate) fn read_u32(&self, offset: usize) -> u32 {
        self.check(offset, 4, 4);
        // SAFETY: in bounds and aligned (checked).
        unsafe { self.ptr.as_ptr().add(offset).cast::<u32>().read_volatile() }
    }

    /// Reads a plain `u16` at `offset`.
    pub(crate) fn read_u16(&self, offset: usize) -> u16 {
        self.check(offset, 2, 2);
        // SAFETY: in bounds and aligned (checked).
        unsafe { self.ptr.as_ptr().add(offset).cast::<u16>().read_volatile() }
    }

    /// Writes a plain `u64` at `offset` (a ring entry owned by this side).
    pub(crate) fn write_u64(&self, offset: usize, value: u64) {
        self.check(offset, 8, 8);
        // SAFETY: in bounds and aligned (checked); the ring protocol gives
        // this entry to us until we publish it, so no one else accesses it.
        unsafe {
            self.ptr
                .as_ptr()
                .add(offset)
                .cast::<u64>()
                .write_volatile(value)
        }
    }

    /// Writes a plain `u32` at `offset`.
    pub(crate) fn write_u32(&self, offset: usize, value: u32) {
        self.check(offset, 4, 4);
        // SAFETY: as for write_u64.
        unsafe {
            self.ptr
                .as_ptr()
                .add(offset)
                .cast::<u32>()
                .write_volatile(value)
        }
    }

    /// Copies `len` bytes at `offset` out into `dst[..len]`.
    pub(crate) fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len(), 1);
        // SAFETY: source in bounds (checked), destination is a distinct Rust
        // slice of the same length.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Copies `src` into the mapping at `offset`.
    pub(crate) fn write_bytes(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len(), 1);
        // SAFETY: destination in bounds (checked) and owned by this side by
        // the ring protocol; source is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns; no references
        // into it outlive self (all borrow self).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// ===== bpf(2) =====

pub(crate) const BPF_MAP_CREATE: libc::c_int = 0;
pub(crate) const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
pub(crate) const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
pub(crate) const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
pub(crate) const BPF_PROG_LOAD: libc::c_int = 5;
pub(crate) const BPF_PROG_TEST_RUN: libc::c_int = 10;
pub(crate) const BPF_LINK_CREATE: libc::c_int = 28;
pub(crate) const BPF_LINK_DETACH: libc::c_int = 34;

/// `union bpf_attr` for BPF_MAP_CREATE (prefix).
#[repr(C)]
#[derive(Default)]
pub(crate) struct MapCreateAttr {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: u32,
    pub numa_node: u32,
    pub map_name: [u8; 16],
}

/// `union bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
pub(crate) struct MapElemAttr {
    pub map_fd: u32,
    pub pad: u32,
    pub key: u64,
    pub value: u64,
    pub flags: u64,
}

/// `union bpf_attr` for BPF_PROG_LOAD (prefix).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProgLoadAttr {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE (prefix) and BPF_LINK_DETACH.
#[repr(C)]
#[derive(Default)]
pub(crate) struct LinkCreateAttr {
    pub prog_fd: u32,
    pub target_ifindex: u32,
    pub attach_type: u32,
    pub flags: u32,
    pub rest: [u64; 4],
}

fn bpf_call<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a repr(C) prefix of bpf_attr with its size; callers
    // guarantee any pointers inside are valid for the command (see the safe
    // wrappers below, which build them from live borrows).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn fd_from_ret(ret: libc::c_long) -> OwnedFd {
    // SAFETY: the bpf commands that return a descriptor return a fresh one,
    // owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(ret as RawFd) }
}

/// A BPF map descriptor with the key and value sizes it was created with, so
/// the element calls can check the buffers the kernel reads and writes.
pub(crate) struct MapFd {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl MapFd {
    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Bytes of a value buffer for the element calls.
    pub(crate) fn value_size(&self) -> usize {
        self.value_size
    }
}

const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;

/// Number of possible CPUs, as the kernel sizes per-CPU map values
/// (`/sys/devices/system/cpu/possible`, e.g. `0-1` or `0-3,8-11`).
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim()).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))
}

/// Highest CPU index in a kernel CPU list, plus one.
pub(crate) fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut max = None;
    for part in list.split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<usize>().ok()?;
        max = max.max(Some(last));
    }
    max.map(|m| m + 1)
}

/// BPF_MAP_CREATE. For per-CPU maps the user-side value buffer holds one
/// 8-byte-aligned value per possible CPU, which the element calls check.
pub(crate) fn bpf_map_create(attr: &mut MapCreateAttr) -> io::Result<MapFd> {
    let mut value_size = attr.value_size as usize;
    if matches!(
        attr.map_type,
        BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_PERCPU_HASH
    ) {
        value_size = value_size.div_ceil(8) * 8 * possible_cpus()?;
    }
    let fd = bpf_call(BPF_MAP_CREATE, attr).map(fd_from_ret)?;
    Ok(MapFd {
        fd,
        key_size: attr.key_size as usize,
        value_size,
    })
}

/// BPF_LINK_CREATE.
pub(crate) fn bpf_link_create(attr: &mut LinkCreateAttr) -> io::Result<OwnedFd> {
    bpf_call(BPF_LINK_CREATE, attr).map(fd_from_ret)
}

/// BPF_LINK_DETACH.
pub(crate) fn bpf_link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkCreateAttr {
        prog_fd: link.as_raw_fd() as u32,
        ..Default::default()
    };
    bpf_call(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// The kernel reads `key_size` bytes of the key and reads or writes
/// `value_size` bytes of the value: refuse buffers of other sizes.
fn check_sizes(map: &MapFd, key: usize, value: Option<usize>) -> io::Result<()> {
    if key != map.key_size || value.is_some_and(|v| v != map.value_size) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    Ok(())
}

/// BPF_MAP_UPDATE_ELEM with byte-slice key and value of the map's sizes.
pub(crate) fn bpf_map_update(map: &MapFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    check_sizes(map, key.len(), Some(value.len()))?;
    let mut attr = MapElemAttr {
        map_fd: map.raw() as u32,
        pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        flags,
    };
    bpf_call(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// BPF_MAP_LOOKUP_ELEM into `value` (of the map's value size).
pub(crate) fn bpf_map_lookup(map: &MapFd, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    check_sizes(map, key.len(), Some(value.len()))?;
    let mut attr = MapElemAttr {
        map_fd: map.raw() as u32,
        pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        flags: 0,
    };
    bpf_call(BPF_MAP_LOOKUP_ELEM, &mut attr).map(drop)
}

/// BPF_MAP_DELETE_ELEM.
pub(crate) fn bpf_map_delete(map: &MapFd, key: &[u8]) -> io::Result<()> {
    check_sizes(map, key.len(), None)?;
    let mut attr = MapElemAttr {
        map_fd: map.raw() as u32,
        pad: 0,
        key: key.as_ptr() as u64,
        value: 0,
        flags: 0,
    };
    bpf_call(BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// BPF_PROG_LOAD of an XDP program; on failure returns the verifier log too.
pub(crate) fn bpf_prog_load_xdp(insns: &[u64], name: &str, log: &mut [u8]) -> io::Result<OwnedFd> {
    const BPF_PROG_TYPE_XDP: u32 = 6;
    const BPF_XDP: u32 = 37;
    let license = b"GPL\0";
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: if log.is_empty() { 0 } else { 1 },
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name,
        expected_attach_type: BPF_XDP,
        ..Default::default()
    };
    // `insns`, `license` and `log` are live borrows for the whole call.
    bpf_call(BPF_PROG_LOAD, &mut attr).map(fd_from_ret)
}

/// `union bpf_attr` for BPF_PROG_TEST_RUN (prefix).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
}

/// `union bpf_attr` for BPF_PROG_TEST_RUN, up to `batch_size` (kernel 5.18+).
#[repr(C)]
#[derive(Default)]
struct TestRunFullAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// `struct xdp_md` as BPF_PROG_TEST_RUN takes it for the context.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct XdpMd {
    pub data: u32,
    pub data_end: u32,
    pub data_meta: u32,
    pub ingress_ifindex: u32,
    pub rx_queue_index: u32,
    pub egress_ifindex: u32,
}

/// `BPF_F_TEST_XDP_LIVE_FRAMES`.
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// BPF_PROG_TEST_RUN in live-frames mode: the kernel runs the XDP program
/// `repeat` times on copies of `data` in its own page pool, `batch_size`
/// frames per softirq-disabled batch, and really transmits what the
/// program redirects (or returns XDP_TX for). No data or context comes
/// back (the kernel refuses output buffers in this mode).
pub(crate) fn bpf_prog_test_run_live(
    prog: BorrowedFd<'_>,
    data: &[u8],
    ctx: &XdpMd,
    repeat: u32,
    batch_size: u32,
) -> io::Result<()> {
    let mut attr = TestRunFullAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: (ctx as *const XdpMd) as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size,
        ..Default::default()
    };
    // `data` and `ctx` are live borrows for the call; the kernel only reads
    // them (the output pointers stay null, as live mode requires).
    bpf_call(BPF_PROG_TEST_RUN, &mut attr).map(drop)
}

/// The signal that ends a live-frames run early (see `LiveFrameGenerator::send_for`).
pub(crate) const INTERRUPT_SIGNAL: libc::c_int = libc::SIGUSR2;

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Makes [`INTERRUPT_SIGNAL`] interrupt system calls of the calling thread
/// without killing the process: a handler that does nothing, installed
/// without `SA_RESTART` (so the bpf syscall returns EINTR), and the signal
/// unblocked in this thread.
fn prepare_interrupt_signal() -> io::Result<()> {
    // SAFETY: sigaction is plain old data; all-zero is a valid value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    action.sa_flags = 0;
    // SAFETY: `action.sa_mask` is a valid sigset_t owned by us.
    cvt(unsafe { libc::sigemptyset(&mut action.sa_mask) })?;
    // SAFETY: the handler does nothing, which is async-signal-safe, and it
    // stays valid for the life of the process (a plain function); the old
    // action is not wanted (null).
    cvt(unsafe { libc::sigaction(INTERRUPT_SIGNAL, &action, std::ptr::null_mut()) })?;
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset next.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by us.
    cvt(unsafe { libc::sigemptyset(&mut set) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::sigaddset(&mut set, INTERRUPT_SIGNAL) })?;
    // SAFETY: `set` is valid for the call; the old mask is not wanted.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// Runs `body` on the calling thread while a scoped timer thread sends
/// [`INTERRUPT_SIGNAL`] to it every millisecond once `expired()` holds,
/// until `body` returns: blocking system calls in `body` (the bpf syscall)
/// then return EINTR. Repeating the signal means one that lands between
/// two calls of `body` cannot be missed.
///
/// The signal is only ever sent while this thread is inside the scope, so
/// the `pthread_t` it is sent to names a live thread.
pub(crate) fn with_interrupts<T>(
    expired: &(dyn Fn() -> bool + Sync),
    body: impl FnOnce() -> T,
) -> io::Result<T> {
    prepare_interrupt_signal()?;
    // SAFETY: pthread_self has no preconditions and cannot fail.
    let me = unsafe { libc::pthread_self() };
    let done = std::sync::atomic::AtomicBool::new(false);
    Ok(std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if expired() {
                    // SAFETY: `me` is the thread that runs this scope, which
                    // cannot end before this scoped thread is joined; the
                    // handler was installed above.
                    unsafe { libc::pthread_kill(me, INTERRUPT_SIGNAL) };
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        let out = body();
        // The timer may signal once more before it sees this; the handler
        // runs while this thread waits for the scope to end, harmlessly.
        done.store(true, std::sync::atomic::Ordering::Release);
        out
    }))
}

/// BPF_PROG_TEST_RUN once on `data`; returns the program's return value.
/// The output data is not copied back (null `data_out`).
pub(crate) fn bpf_prog_test_run(prog: BorrowedFd<'_>, data: &[u8]) -> io::Result<u32> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    // `data` is a live borrow for the call; the kernel only reads it.
    bpf_call(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_highest_index_plus_one() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("0,2"), Some(3));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn mapping_accessors_refuse_out_of_bounds_offsets() {
        let m = Mmap::anonymous(4096).unwrap();
        m.atomic_u32(4094);
    }

    #[test]
    #[should_panic(expected = "misaligned")]
    fn mapping_accessors_refuse_misaligned_offsets() {
        let m = Mmap::anonymous(4096).unwrap();
        m.read_u64(4);
    }
}
