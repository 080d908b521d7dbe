//! A small eBPF assembler: the instructions the steering program needs, with
//! labels resolved into jump offsets. Encodes `struct bpf_insn` as `u64`
//! (code, dst/src registers, 16-bit offset, 32-bit immediate; little-endian
//! hosts only, which is every host AF_XDP targets here).

/// A register, r0..r10.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reg(pub u8);

pub(crate) const R0: Reg = Reg(0);
pub(crate) const R1: Reg = Reg(1);
pub(crate) const R2: Reg = Reg(2);
pub(crate) const R3: Reg = Reg(3);
pub(crate) const R4: Reg = Reg(4);
pub(crate) const R5: Reg = Reg(5);
pub(crate) const R6: Reg = Reg(6);
pub(crate) const R7: Reg = Reg(7);
pub(crate) const R8: Reg = Reg(8);
pub(crate) const R9: Reg = Reg(9);
/// The read-only frame pointer.
pub(crate) const R10: Reg = Reg(10);

/// Access size of loads and stores.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Size {
    Dw = 0x18,
    B = 0x10,
    H = 0x08,
    W = 0x00,
}

/// Jump conditions.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cond {
    Eq = 0x10,
    Gt = 0x20,
    Ne = 0x50,
    Lt = 0xa0,
}

const BPF_LDX_MEM: u8 = 0x01 | 0x60;
const BPF_ST_MEM: u8 = 0x02 | 0x60;
const BPF_STX_MEM: u8 = 0x03 | 0x60;
const BPF_ALU64: u8 = 0x07;
const BPF_JMP: u8 = 0x05;
const BPF_X: u8 = 0x08;
const OP_ADD: u8 = 0x00;
const OP_AND: u8 = 0x50;
const OP_MOD: u8 = 0x90;
const OP_LSH: u8 = 0x60;
const OP_MOV: u8 = 0xb0;
const OP_CALL: u8 = 0x80;
const OP_EXIT: u8 = 0x90;

/// A jump target, bound to a position with [`Asm::bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Label(usize);

/// Instructions under construction.
#[derive(Default)]
pub(crate) struct Asm {
    insns: Vec<u64>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

/// Encodes one instruction.
pub(crate) fn encode(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(dst.0 & 0xf) << 8
        | u64::from(src.0 & 0xf) << 12
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

/// Why an assembly could not be finished.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AsmError {
    UnboundLabel,
    JumpTooFar,
}

impl Asm {
    pub(crate) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `label` to the next instruction.
    pub(crate) fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.insns.len());
    }

    fn emit(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> &mut Self {
        self.insns.push(encode(code, dst, src, off, imm));
        self
    }

    pub(crate) fn mov_reg(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.emit(BPF_ALU64 | OP_MOV | BPF_X, dst, src, 0, 0)
    }

    pub(crate) fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.emit(BPF_ALU64 | OP_MOV, dst, R0, 0, imm)
    }

    pub(crate) fn add_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.emit(BPF_ALU64 | OP_ADD, dst, R0, 0, imm)
    }

    pub(crate) fn add_reg(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.emit(BPF_ALU64 | OP_ADD | BPF_X, dst, src, 0, 0)
    }

    pub(crate) fn and_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.emit(BPF_ALU64 | OP_AND, dst, R0, 0, imm)
    }

    /// `dst %= imm` (unsigned; the verifier refuses imm 0).
    pub(crate) fn mod_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.emit(BPF_ALU64 | OP_MOD, dst, R0, 0, imm)
    }

    pub(crate) fn lsh_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.emit(BPF_ALU64 | OP_LSH, dst, R0, 0, imm)
    }

    /// `dst = htobe(dst)` over the low `bits` (16, 32 or 64) bits: the
    /// BPF_END instruction with BPF_TO_BE.
    pub(crate) fn swap_to_be(&mut self, dst: Reg, bits: i32) -> &mut Self {
        self.emit(0x04 | 0xd0 | 0x08, dst, R0, 0, bits)
    }

    /// `dst = *(size *)(src + off)`.
    pub(crate) fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) -> &mut Self {
        self.emit(BPF_LDX_MEM | size as u8, dst, src, off, 0)
    }

    /// `*(size *)(dst + off) = imm`.
    pub(crate) fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) -> &mut Self {
        self.emit(BPF_ST_MEM | size as u8, dst, R0, off, imm)
    }

    /// `*(size *)(dst + off) = src`.
    pub(crate) fn store_reg(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.emit(BPF_STX_MEM | size as u8, dst, src, off, 0)
    }

    /// `if dst <cond> imm goto target`.
    pub(crate) fn jump_imm(&mut self, cond: Cond, dst: Reg, imm: i32, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.emit(BPF_JMP | cond as u8, dst, R0, 0, imm)
    }

    /// `if dst <cond> src goto target`.
    pub(crate) fn jump_reg(&mut self, cond: Cond, dst: Reg, src: Reg, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.emit(BPF_JMP | cond as u8 | BPF_X, dst, src, 0, 0)
    }

    /// `goto target`.
    pub(crate) fn jump(&mut self, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.emit(BPF_JMP, R0, R0, 0, 0)
    }

    /// `call helper`.
    pub(crate) fn call(&mut self, helper: i32) -> &mut Self {
        self.emit(BPF_JMP | OP_CALL, R0, R0, 0, helper)
    }

    pub(crate) fn exit(&mut self) -> &mut Self {
        self.emit(BPF_JMP | OP_EXIT, R0, R0, 0, 0)
    }

    /// `dst = map` (a 16-byte `ld_imm64` with BPF_PSEUDO_MAP_FD).
    pub(crate) fn load_map_fd(&mut self, dst: Reg, fd: i32) -> &mut Self {
        self.emit(0x18, dst, Reg(1), 0, fd);
        self.emit(0, R0, R0, 0, 0)
    }

    /// Resolves the labels.
    pub(crate) fn finish(mut self) -> Result<Vec<u64>, AsmError> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].ok_or(AsmError::UnboundLabel)?;
            let off = target as i64 - at as i64 - 1;
            let off = i16::try_from(off).map_err(|_| AsmError::JumpTooFar)?;
            self.insns[at] = (self.insns[at] & !0xffff_0000) | u64::from(off as u16) << 16;
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_struct_bpf_insn() {
        // r0 = 2 is b7 00 00 00 02 00 00 00 in the kernel's byte order.
        let mut a = Asm::default();
        a.mov_imm(R0, 2).exit();
        let insns = a.finish().unwrap();
        assert_eq!(insns[0].to_le_bytes(), [0xb7, 0x00, 0, 0, 2, 0, 0, 0]);
        assert_eq!(insns[1].to_le_bytes(), [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn byte_swap_to_big_endian_is_bpf_end_with_the_width_in_imm() {
        // be64 r1 is dc 01 00 00 40 00 00 00 (llvm-objdump of `r1 = be64 r1`).
        let mut a = Asm::default();
        a.swap_to_be(R1, 64);
        let insns = a.finish().unwrap();
        assert_eq!(insns[0].to_le_bytes(), [0xdc, 0x01, 0, 0, 0x40, 0, 0, 0]);
        // r3 %= 16 is 97 03 00 00 10 00 00 00.
        let mut a = Asm::default();
        a.mod_imm(R3, 16);
        let insns = a.finish().unwrap();
        assert_eq!(insns[0].to_le_bytes(), [0x97, 0x03, 0, 0, 16, 0, 0, 0]);
    }

    #[test]
    fn registers_and_offsets_land_in_their_fields() {
        // r2 = *(u32 *)(r6 + 16): code 0x61, dst 2, src 6, off 16.
        assert_eq!(
            encode(0x61, R2, R6, 16, 0).to_le_bytes(),
            [0x61, 0x62, 16, 0, 0, 0, 0, 0]
        );
        // Negative offset: *(u32 *)(r10 - 4) = 0.
        assert_eq!(
            encode(0x62, R10, R0, -4, 0).to_le_bytes(),
            [0x62, 0x0a, 0xfc, 0xff, 0, 0, 0, 0]
        );
    }

    #[test]
    fn labels_resolve_forward_and_backward() {
        let mut a = Asm::default();
        let top = a.label();
        let out = a.label();
        a.bind(top);
        a.jump_imm(Cond::Eq, R1, 0, out); // 0 -> 3: off 2
        a.mov_imm(R0, 1);
        a.jump(top); // 2 -> 0: off -3
        a.bind(out);
        a.exit();
        let insns = a.finish().unwrap();
        assert_eq!((insns[0] >> 16) as u16 as i16, 2);
        assert_eq!((insns[2] >> 16) as u16 as i16, -3);
    }

    #[test]
    fn an_unbound_label_is_an_error() {
        let mut a = Asm::default();
        let nowhere = a.label();
        a.jump(nowhere);
        assert_eq!(a.finish(), Err(AsmError::UnboundLabel));
    }

    #[test]
    fn map_fd_load_takes_two_slots_with_pseudo_source() {
        let mut a = Asm::default();
        a.load_map_fd(R1, 7);
        let insns = a.finish().unwrap();
        assert_eq!(insns.len(), 2);
        assert_eq!(insns[0].to_le_bytes(), [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(insns[1], 0);
    }
}
