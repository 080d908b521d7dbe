//! The UMEM: one mmap'ed region cut into fixed power-of-two chunks, shared by
//! every socket a worker binds on it.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use crate::Desc;
use crate::error::{Context, Error, Result};
use crate::sys::Mmap;

/// Size and layout of a UMEM, validated by [`UmemConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UmemConfig {
    /// Number of chunks.
    pub frame_count: u32,
    /// Chunk size: a power of two from 2048 to 4096 (AF_XDP aligned mode).
    pub frame_size: u32,
    /// Extra headroom the kernel leaves in front of received packets, on top
    /// of [`crate::XDP_PACKET_HEADROOM`].
    pub headroom: u32,
}

impl Default for UmemConfig {
    /// 4096 chunks of 2048 bytes: 8 MiB, the memlock limit of these machines.
    fn default() -> Self {
        UmemConfig {
            frame_count: 4096,
            frame_size: 2048,
            headroom: 0,
        }
    }
}

impl UmemConfig {
    /// Checks the values the kernel would refuse, before any syscall.
    pub fn validate(&self) -> Result<()> {
        if !self.frame_size.is_power_of_two() || !(2048..=4096).contains(&self.frame_size) {
            return Err(Error::Config(
                "UMEM frame size must be a power of two from 2048 to 4096",
            ));
        }
        if self.frame_count == 0 {
            return Err(Error::Config("UMEM needs at least one frame"));
        }
        if self.headroom > self.frame_size / 2 {
            return Err(Error::Config("UMEM headroom must be at most half a frame"));
        }
        if u64::from(self.frame_count) * u64::from(self.frame_size) > 1 << 40 {
            return Err(Error::Config("UMEM larger than 1 TiB"));
        }
        Ok(())
    }

    /// Bytes of the region.
    pub fn len(&self) -> u64 {
        u64::from(self.frame_count) * u64::from(self.frame_size)
    }

    /// Whether the region is empty (never, once validated).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which sockets use the UMEM: the first one registered it, later ones bind
/// with XDP_SHARED_UMEM naming any one still open.
#[derive(Default)]
pub(crate) struct Registration {
    pub(crate) sockets: Vec<(u32, u32, Weak<OwnedFd>)>,
}

impl Registration {
    /// A live, bound socket of this UMEM to share from, pruning closed ones.
    pub(crate) fn live_owner(&mut self) -> Option<Arc<OwnedFd>> {
        self.sockets.retain(|(_, _, fd)| fd.strong_count() > 0);
        self.sockets.iter().find_map(|(_, _, fd)| fd.upgrade())
    }

    pub(crate) fn is_taken(&self, ifindex: u32, queue: u32) -> bool {
        self.sockets
            .iter()
            .any(|(i, q, fd)| *i == ifindex && *q == queue && fd.strong_count() > 0)
    }
}

/// The frame region. Not `Clone`: exactly one owner reads and writes frames;
/// sockets refer to it only through the kernel's registration.
pub struct Umem {
    handle: UmemHandle,
}

/// A cloneable, `Send` handle on a [`Umem`] that binds sockets on it (see
/// [`crate::XskSocket::bind_handle`]) but cannot touch its frames: a control
/// thread binds a new pod port's socket while the worker keeps the `Umem`
/// itself. It keeps the mapping alive, so the kernel never registers memory
/// that has been unmapped.
#[derive(Clone)]
pub struct UmemHandle {
    pub(crate) mem: Arc<Mmap>,
    pub(crate) config: UmemConfig,
    pub(crate) registration: Arc<Mutex<Registration>>,
}

impl std::fmt::Debug for UmemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemHandle")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Umem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Umem")
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

impl Umem {
    /// Maps (and pre-faults) the region. It is registered with the kernel by
    /// the first [`crate::XskSocket`] bound on it, which is where the memlock
    /// limit applies.
    pub fn new(config: UmemConfig) -> Result<Umem> {
        config.validate()?;
        let mem = Mmap::anonymous(config.len() as usize).ctx("mmap UMEM")?;
        Ok(Umem {
            handle: UmemHandle {
                mem: Arc::new(mem),
                config,
                registration: Arc::default(),
            },
        })
    }

    /// A handle that binds sockets on this UMEM from another thread.
    pub fn handle(&self) -> UmemHandle {
        self.handle.clone()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> UmemConfig {
        self.handle.config
    }

    /// Chunk size in bytes.
    pub fn frame_size(&self) -> u32 {
        self.handle.config.frame_size
    }

    /// Number of chunks.
    pub fn frame_count(&self) -> u32 {
        self.handle.config.frame_count
    }

    /// Address of chunk `index`.
    pub fn frame_addr(&self, index: u32) -> u64 {
        u64::from(index) * u64::from(self.frame_size())
    }

    /// The start address of the chunk holding `addr`.
    pub fn chunk_of(&self, addr: u64) -> u64 {
        addr & !(u64::from(self.frame_size()) - 1)
    }

    /// The whole region.
    pub fn as_slice(&self) -> &[u8] {
        self.handle.mem.as_slice()
    }

    /// The whole region, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // Umem is not Clone and UmemHandle exposes no bytes, so `&mut self`
        // is the only way to the frames; parts made by `split` write only
        // the chunks their owner holds (see there).
        self.handle.mem.as_mut_slice_exclusive()
    }

    /// A frame's bytes, or `None` if the descriptor falls outside the region.
    pub fn data(&self, d: Desc) -> Option<&[u8]> {
        let start = usize::try_from(d.addr).ok()?;
        self.as_slice()
            .get(start..start.checked_add(d.len as usize)?)
    }

    /// A frame's bytes, writable, or `None` if outside the region.
    pub fn data_mut(&mut self, d: Desc) -> Option<&mut [u8]> {
        let start = usize::try_from(d.addr).ok()?;
        self.as_mut_slice()
            .get_mut(start..start.checked_add(d.len as usize)?)
    }

    /// Splits the region between `parts` owners (one per worker thread).
    /// Every part is a `Umem` over the same memory and the same kernel
    /// registration, so sockets bound through any part's handle share one
    /// UMEM (XDP_SHARED_UMEM, each socket with its own fill and completion
    /// rings) and a frame received by one worker leaves through another
    /// worker's socket by its address, without a copy.
    ///
    /// Each part sees the whole region (descriptor addresses are offsets
    /// into it), but its owner must read and write only the chunks it holds:
    /// the ones in its share of the free list, or one handed to it over a
    /// ring, exactly as a chunk on the kernel's rings is the kernel's. The
    /// caller keeps that protocol (brindle-vrouter's `FrameHome` routes
    /// every chunk back to the worker that owns it).
    pub fn split(self, parts: usize) -> Vec<Umem> {
        (0..parts.max(1))
            .map(|_| Umem {
                handle: self.handle.clone(),
            })
            .collect()
    }

    pub(crate) fn handle_ref(&self) -> &UmemHandle {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_parts_are_one_region_and_one_registration() {
        let umem = Umem::new(UmemConfig {
            frame_count: 8,
            ..UmemConfig::default()
        })
        .unwrap();
        let mut parts = umem.split(2);
        assert_eq!(parts.len(), 2);
        // What one part writes in its chunk, the other sees at the same
        // address: one memory, as the kernel sees it.
        parts[0].as_mut_slice()[2048 + 256] = 0xab;
        assert_eq!(parts[1].as_slice()[2048 + 256], 0xab);
        assert_eq!(parts[0].as_slice().len(), parts[1].as_slice().len());
        assert!(Arc::ptr_eq(
            &parts[0].handle().registration,
            &parts[1].handle().registration
        ));
    }

    #[test]
    fn default_config_is_eight_mebibytes_and_valid() {
        let c = UmemConfig::default();
        c.validate().unwrap();
        assert_eq!(c.len(), 8 << 20);
    }

    #[test]
    fn frame_size_must_be_a_supported_power_of_two() {
        for bad in [0, 1000, 3000, 1024, 8192] {
            let c = UmemConfig {
                frame_size: bad,
                ..UmemConfig::default()
            };
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{bad}");
        }
        let c = UmemConfig {
            frame_size: 4096,
            ..UmemConfig::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn zero_frames_and_oversized_headroom_are_refused() {
        let zero = UmemConfig {
            frame_count: 0,
            ..UmemConfig::default()
        };
        assert!(zero.validate().is_err());
        let headroom = UmemConfig {
            headroom: 1500,
            ..UmemConfig::default()
        };
        assert!(headroom.validate().is_err());
    }

    #[test]
    fn data_is_bounds_checked_and_chunk_arithmetic_masks() {
        let mut umem = Umem::new(UmemConfig {
            frame_count: 4,
            ..UmemConfig::default()
        })
        .unwrap();
        assert_eq!(umem.as_slice().len(), 4 * 2048);
        assert_eq!(umem.chunk_of(2048 + 300), 2048);
        assert_eq!(umem.frame_addr(3), 6144);
        umem.data_mut(Desc {
            addr: 2048 + 256,
            len: 4,
        })
        .unwrap()
        .copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(umem.as_slice()[2048 + 256..2048 + 260], [1, 2, 3, 4]);
        assert!(
            umem.data(Desc {
                addr: 4 * 2048 - 2,
                len: 4
            })
            .is_none()
        );
        assert!(
            umem.data(Desc {
                addr: u64::MAX,
                len: 4
            })
            .is_none()
        );
    }
}
