"""Split the TCP payloads of a pcap into BGP messages, one hex line each.

Writes session.hex (name, direction, hex) next to this script and the
binary seeds for the fuzz targets in ctrl/fuzz/corpus/<target>/seed-*.
"""
import os
import struct
import sys

NAMES = {1: "open", 2: "update", 3: "notification", 4: "keepalive", 5: "route_refresh"}
SPEAKERS = {"10.0.0.1": "bird", "10.0.0.3": "bird-as2", "10.0.0.2": "gobgp", "10.0.0.4": "gobgp"}


def packets(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        yield linktype, data[off + 16:off + 16 + incl]
        off += 16 + incl


def write_seeds(fuzzdir, kind, name, msg):
    """Seeds in the fuzz targets' input format: one octet of decode context
    (bit 0: four-octet AS, bit 1: RFC 7606), then the message without its
    header (typed targets) or from its type octet on (`message`)."""
    typed = {"open", "update", "notification", "route_refresh"}
    targets = [("message", msg[18:])]
    if kind in typed:
        targets.append((kind, msg[19:]))
    for target, body in targets:
        d = os.path.join(fuzzdir, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(b"\x03" + body)


def main():
    pcap, outdir = sys.argv[1], sys.argv[2]
    streams = {}
    order = []
    for linktype, frame in packets(pcap):
        if linktype != 1 or len(frame) < 14 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        src = ".".join(str(b) for b in ip[12:16])
        dst = ".".join(str(b) for b in ip[16:20])
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        payload = tcp[doff:]
        if not payload:
            continue
        key = (src, sport, dst, dport)
        st = streams.setdefault(key, {"next": None, "buf": b""})
        if st["next"] is not None and seq != st["next"]:
            continue  # retransmission or reordering: not expected on a veth
        st["next"] = (seq + len(payload)) & 0xFFFFFFFF
        st["buf"] += payload
        while len(st["buf"]) >= 19:
            length = struct.unpack(">H", st["buf"][16:18])[0]
            if len(st["buf"]) < length:
                break
            msg, st["buf"] = st["buf"][:length], st["buf"][length:]
            order.append((SPEAKERS.get(src, src), SPEAKERS.get(dst, dst), msg))
    counts = {}
    lines = []
    fuzzdir = os.path.join(outdir, "..", "..", "fuzz", "corpus")
    for sender, receiver, msg in order:
        kind = NAMES.get(msg[18], "type%d" % msg[18])
        counts[(sender, kind)] = counts.get((sender, kind), 0) + 1
        name = "%s-%s-%d" % (sender, kind, counts[(sender, kind)])
        lines.append("%s %s %s" % (name, receiver, msg.hex()))
        write_seeds(fuzzdir, kind, name, msg)
    with open(os.path.join(outdir, "session.hex"), "w") as f:
        f.write("# name receiver hex: every BGP message of one BIRD 2.0.12 <-> GoBGP 3.10.0 session, in order\n")
        f.write("\n".join(lines) + "\n")
    print("%d messages" % len(lines))


if __name__ == "__main__":
    main()
