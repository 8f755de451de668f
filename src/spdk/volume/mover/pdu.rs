//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, "TP 8000") and the
//! NVMe submission and completion entries they carry, as the mover's host
//! side sends and reads them: no digests, no TLS, PDU data at the header's
//! end (the host asks HPDA 0; SPDK answers CPDA 0).
//!
//! ```text
//!   common header (8 bytes): type | flags | hlen | pdo | plen (u32, LE)
//!   ICReq/ICResp   128-byte header          connection setup
//!   CapsuleCmd     8 + 64 (SQE) [+ data]    a command, data in the capsule when small
//!   CapsuleResp    8 + 16 (CQE)             its completion
//!   C2HData        24 + data                read data (flag SUCCESS: no CapsuleResp follows)
//!   R2T            24                       the target asks for write data
//!   H2CData        24 + data                write data, as asked
//!   C2HTermReq     24 + ...                 the target ends the connection
//! ```

/// PDU types.
pub const IC_REQ: u8 = 0x00;
/// See [`IC_REQ`].
pub const IC_RESP: u8 = 0x01;
/// See [`IC_REQ`].
pub const C2H_TERM_REQ: u8 = 0x03;
/// See [`IC_REQ`].
pub const CAPSULE_CMD: u8 = 0x04;
/// See [`IC_REQ`].
pub const CAPSULE_RESP: u8 = 0x05;
/// See [`IC_REQ`].
pub const H2C_DATA: u8 = 0x06;
/// See [`IC_REQ`].
pub const C2H_DATA: u8 = 0x07;
/// See [`IC_REQ`].
pub const R2T: u8 = 0x09;

/// The last data PDU of a command (C2HData) or of an R2T's data (H2CData).
pub const FLAG_LAST: u8 = 0x04;
/// C2HData: the command succeeded, no CapsuleResp follows.
pub const FLAG_SUCCESS: u8 = 0x08;

/// The common header's length.
pub const CH_LEN: usize = 8;
/// ICReq/ICResp header length.
pub const IC_LEN: usize = 128;
/// CapsuleCmd header length (the common header and one SQE).
pub const CMD_LEN: usize = CH_LEN + 64;
/// CapsuleResp header length.
pub const RESP_LEN: usize = CH_LEN + 16;
/// C2HData, H2CData and R2T header length.
pub const DATA_LEN: usize = 24;

/// Admin and fabrics opcodes the mover sends.
pub const OPC_FABRICS: u8 = 0x7f;
/// Identify.
pub const OPC_IDENTIFY: u8 = 0x06;
/// Keep Alive.
pub const OPC_KEEP_ALIVE: u8 = 0x18;
/// NVM Write.
pub const OPC_WRITE: u8 = 0x01;
/// NVM Read.
pub const OPC_READ: u8 = 0x02;
/// Fabrics command types.
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
/// See [`FCTYPE_PROPERTY_SET`].
pub const FCTYPE_CONNECT: u8 = 0x01;
/// See [`FCTYPE_PROPERTY_SET`].
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;

/// A common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// PDU type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Header length.
    pub hlen: u8,
    /// PDU data offset (0: no data).
    pub pdo: u8,
    /// Whole PDU length.
    pub plen: u32,
}

impl Header {
    /// Parses the 8 bytes of a common header.
    pub fn parse(b: &[u8; CH_LEN]) -> Header {
        Header {
            kind: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    fn put(&self, b: &mut [u8]) {
        b[0] = self.kind;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        b[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }
}

/// The little-endian u16 at byte `at`.
pub(super) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at byte `at`.
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// An ICReq: protocol version 0, HPDA 0, no digests, one R2T at a time
/// (MAXR2T is 0's based).
pub fn ic_req() -> [u8; IC_LEN] {
    let mut b = [0u8; IC_LEN];
    Header {
        kind: IC_REQ,
        flags: 0,
        hlen: IC_LEN as u8,
        pdo: 0,
        plen: IC_LEN as u32,
    }
    .put(&mut b);
    b
}

/// What an ICResp says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// Controller PDU data alignment.
    pub cpda: u8,
    /// Digests the target turned on.
    pub dgst: u8,
    /// The most data one H2CData PDU may carry.
    pub max_h2c_data: u32,
}

/// A PDU or a data structure the mover cannot take: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

/// Parses an ICResp's 120 bytes after its common header; refuses digests
/// and a PDU data alignment (the mover asked for neither).
pub fn ic_resp(rest: &[u8]) -> Result<IcResp, Malformed> {
    if rest.len() < IC_LEN - CH_LEN {
        return Err(Malformed(format!("ICResp of {} bytes", rest.len() + CH_LEN)));
    }
    // offsets in the PDU, minus the common header
    let r = IcResp {
        cpda: rest[10 - CH_LEN],
        dgst: rest[11 - CH_LEN],
        max_h2c_data: u32_at(rest, 12 - CH_LEN),
    };
    if r.dgst != 0 || r.cpda != 0 {
        return Err(Malformed(format!(
            "ICResp asks for digests {:#x} and PDU data alignment {} (none asked)",
            r.dgst, r.cpda
        )));
    }
    if r.max_h2c_data < 4096 {
        return Err(Malformed(format!(
            "ICResp's MAXH2CDATA {} is below 4096",
            r.max_h2c_data
        )));
    }
    Ok(r)
}

/// A 64-byte submission queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl Sqe {
    /// An entry of `opcode`, its data described by an SGL (PSDT 01b, as
    /// NVMe over Fabrics requires), with a null data descriptor.
    pub fn new(opcode: u8) -> Sqe {
        let mut b = [0u8; 64];
        b[0] = opcode;
        b[1] = 0x40;
        let mut s = Sqe(b);
        s.host_data(0);
        s
    }

    /// A fabrics command of type `fctype`.
    pub fn fabrics(fctype: u8) -> Sqe {
        let mut s = Sqe::new(OPC_FABRICS);
        s.0[4] = fctype;
        s
    }

    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }

    /// The command identifier.
    pub fn cid(&self) -> u16 {
        u16_at(&self.0, 2)
    }

    /// Sets the namespace id.
    pub fn nsid(mut self, nsid: u32) -> Sqe {
        self.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        self
    }

    /// Sets command dword `n` (10..=15).
    pub fn cdw(mut self, n: usize, v: u32) -> Sqe {
        let at = n * 4;
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
        self
    }

    /// Writes `v` at byte `at` (fabrics command fields).
    pub fn put(mut self, at: usize, v: &[u8]) -> Sqe {
        self.0[at..at + v.len()].copy_from_slice(v);
        self
    }

    /// Data of `len` bytes in the capsule (a data block descriptor, offset 0).
    pub fn in_capsule(&mut self, len: u32) {
        self.sgl(0x01, len);
    }

    /// Data of `len` bytes moved by C2HData or R2T/H2CData (a transport
    /// SGL data block descriptor, subtype "transport specific": SPDK refuses
    /// subtype 0 with "Invalid NVMf I/O Command SGL").
    pub fn host_data(&mut self, len: u32) {
        self.sgl(0x5a, len);
    }

    fn sgl(&mut self, kind: u8, len: u32) {
        self.0[24..32].fill(0);
        self.0[32..36].copy_from_slice(&len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = kind;
    }
}

/// A CapsuleCmd PDU's header for `sqe` with `data` bytes in the capsule
/// (the data follows it).
pub fn capsule_cmd(sqe: &Sqe, data: u32) -> [u8; CMD_LEN] {
    let mut b = [0u8; CMD_LEN];
    Header {
        kind: CAPSULE_CMD,
        flags: 0,
        hlen: CMD_LEN as u8,
        pdo: if data > 0 { CMD_LEN as u8 } else { 0 },
        plen: CMD_LEN as u32 + data,
    }
    .put(&mut b);
    b[CH_LEN..].copy_from_slice(&sqe.0);
    b
}

/// An H2CData PDU's header: `len` bytes of command `cid`'s data at `offset`
/// for transfer `ttag` (the data follows it).
pub fn h2c_data(cid: u16, ttag: u16, offset: u32, len: u32, last: bool) -> [u8; DATA_LEN] {
    let mut b = [0u8; DATA_LEN];
    Header {
        kind: H2C_DATA,
        flags: if last { FLAG_LAST } else { 0 },
        hlen: DATA_LEN as u8,
        pdo: DATA_LEN as u8,
        plen: DATA_LEN as u32 + len,
    }
    .put(&mut b);
    b[8..10].copy_from_slice(&cid.to_le_bytes());
    b[10..12].copy_from_slice(&ttag.to_le_bytes());
    b[12..16].copy_from_slice(&offset.to_le_bytes());
    b[16..20].copy_from_slice(&len.to_le_bytes());
    b
}

/// The fields of a C2HData, H2CData or R2T header after its common header
/// (16 bytes): the command id, the transfer tag, the data offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// The command.
    pub cid: u16,
    /// The transfer tag (R2T, H2CData).
    pub ttag: u16,
    /// The data's offset in the command's data.
    pub offset: u32,
    /// Its length.
    pub len: u32,
}

impl DataHeader {
    /// Parses the 16 bytes after the common header.
    pub fn parse(rest: &[u8; DATA_LEN - CH_LEN]) -> DataHeader {
        DataHeader {
            cid: u16_at(rest, 0),
            ttag: u16_at(rest, 2),
            offset: u32_at(rest, 4),
            len: u32_at(rest, 8),
        }
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Dword 0 (command specific: a Connect's controller id, a Property Get's value).
    pub dw0: u32,
    /// Dword 1.
    pub dw1: u32,
    /// The command.
    pub cid: u16,
    /// The status field (without the phase bit).
    pub status: u16,
}

impl Cqe {
    /// Parses 16 bytes.
    pub fn parse(b: &[u8; 16]) -> Cqe {
        Cqe {
            dw0: u32_at(b, 0),
            dw1: u32_at(b, 4),
            cid: u16_at(b, 12),
            status: u16_at(b, 14) >> 1,
        }
    }

    /// The completion of a C2HData PDU with the SUCCESS flag.
    pub fn success(cid: u16) -> Cqe {
        Cqe {
            dw0: 0,
            dw1: 0,
            cid,
            status: 0,
        }
    }

    /// Whether the command succeeded.
    pub fn ok(&self) -> bool {
        self.status & 0x7ff == 0
    }

    /// The status as NVMe names it: type and code.
    pub fn describe(&self) -> String {
        let sct = (self.status >> 8) & 0x7;
        let sc = self.status & 0xff;
        let what = match (sct, sc) {
            (0, 0x02) => " (invalid field in command)",
            (0, 0x80) => " (LBA out of range)",
            (0, 0x04) => " (data transfer error)",
            (0, 0x06) => " (internal error)",
            (0, 0x0b) => " (invalid namespace)",
            (1, 0x82) => " (connect: invalid parameters)",
            (1, 0x84) => " (connect: invalid host)",
            (2, 0x81) => " (unrecovered read error)",
            (2, 0x80) => " (write fault)",
            (2, 0x86) => " (access denied)",
            _ => "",
        };
        format!("status type {sct:#x} code {sc:#04x}{what}")
    }
}

/// A Fabrics Connect's 1024 bytes of data: host id, controller id (0xffff:
/// any, for an admin queue), subsystem and host NQN.
pub fn connect_data(hostid: &uuid::Uuid, cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    let mut d = vec![0u8; 1024];
    d[0..16].copy_from_slice(hostid.as_bytes());
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    let n = subnqn.len().min(255);
    d[256..256 + n].copy_from_slice(&subnqn.as_bytes()[..n]);
    let n = hostnqn.len().min(255);
    d[512..512 + n].copy_from_slice(&hostnqn.as_bytes()[..n]);
    d
}

/// A Fabrics Connect of queue `qid` with `sqsize` entries (0's based) and
/// keep-alive timeout `kato_ms`.
pub fn connect(qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
    let mut s = Sqe::fabrics(FCTYPE_CONNECT)
        .put(42, &qid.to_le_bytes())
        .put(44, &sqsize.to_le_bytes())
        .put(48, &kato_ms.to_le_bytes());
    s.in_capsule(1024);
    s
}

/// A Property Get of the register at `offset`, 8 bytes wide when `wide`.
pub fn property_get(offset: u32, wide: bool) -> Sqe {
    Sqe::fabrics(FCTYPE_PROPERTY_GET)
        .put(40, &[u8::from(wide)])
        .put(44, &offset.to_le_bytes())
}

/// A Property Set of the 4-byte register at `offset` to `value`.
pub fn property_set(offset: u32, value: u32) -> Sqe {
    Sqe::fabrics(FCTYPE_PROPERTY_SET)
        .put(40, &[0])
        .put(44, &offset.to_le_bytes())
        .put(48, &u64::from(value).to_le_bytes())
}

/// Controller registers.
pub const REG_CAP: u32 = 0x00;
/// See [`REG_CAP`].
pub const REG_CC: u32 = 0x14;
/// See [`REG_CAP`].
pub const REG_CSTS: u32 = 0x1c;
/// CC: enabled, NVM command set, 4 KiB pages, 64-byte SQEs, 16-byte CQEs.
pub const CC_ENABLE: u32 = (4 << 20) | (6 << 16) | 1;

/// An NVM Read or Write of `blocks` (at least one) at `lba` of namespace 1.
pub fn rw(opcode: u8, lba: u64, blocks: u32) -> Sqe {
    Sqe::new(opcode)
        .nsid(1)
        .cdw(10, lba as u32)
        .cdw(11, (lba >> 32) as u32)
        .cdw(12, blocks.saturating_sub(1) & 0xffff)
}

/// Identify (`cns` 1: the controller; 0: namespace `nsid`), 4096 bytes.
pub fn identify(cns: u32, nsid: u32) -> Sqe {
    let mut s = Sqe::new(OPC_IDENTIFY).nsid(nsid).cdw(10, cns);
    s.host_data(4096);
    s
}

/// What the mover needs of Identify Controller: the most data one command
/// moves (MDTS, in 4 KiB pages as a power of two; 0: no limit) and the I/O
/// queues' capsule size (IOCCSZ, 16-byte units, the SQE included).
pub fn identify_controller(d: &[u8]) -> (u8, u32) {
    (d[77], u32_at(d, 1792))
}

/// What the mover needs of Identify Namespace: its size in blocks and its
/// block size.
pub fn identify_namespace(d: &[u8]) -> Result<(u64, u32), Malformed> {
    let nsze = u64::from(u32_at(d, 0)) | (u64::from(u32_at(d, 4)) << 32);
    let flbas = usize::from(d[26] & 0x0f) | (usize::from((d[26] >> 5) & 0x3) << 4);
    let lbads = d[128 + flbas * 4 + 2];
    if !(9..=16).contains(&lbads) {
        return Err(Malformed(format!("namespace block size 2^{lbads}")));
    }
    Ok((nsze, 1u32 << lbads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_command_says_its_blocks_zero_based_and_its_data_by_transport_sgl() {
        let mut s = rw(OPC_READ, 0x1_0000_0002, 32);
        s.set_cid(7);
        s.host_data(32 * 4096);
        let h = capsule_cmd(&s, 0);
        assert_eq!(&h[..8], &[CAPSULE_CMD, 0, 72, 0, 72, 0, 0, 0]);
        let b = &h[8..];
        assert_eq!((b[0], b[1], u16_at(b, 2), u32_at(b, 4)), (OPC_READ, 0x40, 7, 1));
        assert_eq!((u32_at(b, 40), u32_at(b, 44), u32_at(b, 48)), (2, 1, 31));
        assert_eq!((u32_at(b, 32), b[39]), (32 * 4096, 0x5a));
    }

    #[test]
    fn a_connect_carries_its_queue_and_its_data_in_the_capsule() {
        let s = connect(1, 127, 30_000);
        let h = capsule_cmd(&s, 1024);
        assert_eq!((h[3], u32_at(&h, 4)), (72, 72 + 1024));
        let b = &h[8..];
        assert_eq!((b[0], b[4], u16_at(b, 42), u16_at(b, 44)), (0x7f, 1, 1, 127));
        assert_eq!((u32_at(b, 48), u32_at(b, 32), b[39]), (30_000, 1024, 0x01));
        let d = connect_data(&uuid::Uuid::nil(), 0xffff, "nqn.a", "nqn.b");
        assert_eq!(
            (u16_at(&d, 16), &d[256..261], &d[512..517]),
            (0xffff, &b"nqn.a"[..], &b"nqn.b"[..])
        );
    }

    #[test]
    fn a_completion_reads_its_status_without_the_phase_bit() {
        let mut b = [0u8; 16];
        b[0] = 5;
        b[12] = 9;
        b[14] = 1; // phase only
        let c = Cqe::parse(&b);
        assert!(c.ok());
        assert_eq!((c.dw0, c.cid), (5, 9));
        b[14] = 0;
        b[15] = 0x01; // status 0x100 >> 1: SC 0x80
        let c = Cqe::parse(&b);
        assert!(!c.ok());
        assert!(c.describe().contains("LBA out of range"), "{}", c.describe());
    }

    #[test]
    fn an_icresp_with_digests_is_refused() {
        let mut r = [0u8; 120];
        r[12 - 8..16 - 8].copy_from_slice(&131072u32.to_le_bytes());
        assert_eq!(ic_resp(&r).expect("plain").max_h2c_data, 131072);
        r[11 - 8] = 1;
        assert!(ic_resp(&r).is_err());
    }
}
