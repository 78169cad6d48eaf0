"""Which user of this machine holds the other end of a TCP connection (Linux).

The SuperLink's control address serves only the coordinator's own processes, which run as the coordinator's user;
a connection from another user's process there can only be an attack (holding its connections stalls the run:
``fedseg.flower.connection_limits``). TCP carries no credentials, but on Linux both ends of a connection between
two processes of this machine are sockets the kernel knows: :func:`local_peer_uid` asks it (``sock_diag``, the
netlink interface ``ss`` uses; no privilege needed, ~50 µs) for the user owning the socket at the connection's other
end. A peer on another machine, or in another network namespace (a container), is not found: None.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4  # linux/netlink.h
SOCK_DIAG_BY_FAMILY = 20  # linux/sock_diag.h: the request (and reply) type
NLM_F_REQUEST = 0x1
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
DIAG_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
SOCKET_ID = struct.Struct("!HH16s16s")  # inet_diag_sockid: source port, destination port, addresses (big-endian)
SOCKET_ID_REST = struct.Struct("=III")  # interface, cookie (2 x 32 bit; all ones: any)
ANY_COOKIE = 0xFFFFFFFF
ALL_STATES = 0xFFFFFFFF
TCP_LISTEN = 10  # linux/tcp_states.h: a listening socket's state
TCP_TIME_WAIT = 6  # a socket closed by its side: the kernel reports it as user 0
UID_AT = 4 + 48 + 12  # inet_diag_msg: family, state, timer, retransmits; the socket id; expires, queues; uid, inode


def local_peer_uid(local: tuple, peer: tuple) -> int | None:
    """The user id owning the TCP socket at ``peer`` (host, port) whose connection reaches ``local`` (host, port:
    this end's ``getsockname()``), where that socket is on this machine (Linux); None where it is not (another
    machine, another network namespace) or the kernel cannot say (another system, no netlink)."""
    found = local_peer_socket(local, peer)
    return None if found is None else found[0]


def local_peer_socket(local: tuple, peer: tuple) -> tuple[int, int] | None:
    """``(user id, inode)`` of the socket :func:`local_peer_uid` looks up (the inode: ``os.fstat`` of that socket's
    file descriptor gives the same), or None."""
    try:
        family, peer_host, local_host = _addresses(str(peer[0]), str(local[0]))
        request = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_STATES)
        request += SOCKET_ID.pack(int(peer[1]), int(local[1]), peer_host, local_host)
        request += SOCKET_ID_REST.pack(0, ANY_COOKIE, ANY_COOKIE)
        header = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as netlink:
            netlink.settimeout(1.0)
            netlink.send(header + request)
            reply = netlink.recv(65536)
    except (OSError, ValueError, AttributeError, struct.error):  # AttributeError: no AF_NETLINK on this system
        return None
    if len(reply) < NLMSG_HEADER.size + UID_AT + 4:
        return None  # an error message (the socket is not this machine's) or too short to hold a uid
    kind = NLMSG_HEADER.unpack_from(reply)[1]
    if kind != SOCK_DIAG_BY_FAMILY:
        return None
    state = reply[NLMSG_HEADER.size + 1]
    ports = struct.unpack_from("!HH", reply, NLMSG_HEADER.size + 4)
    if state in (TCP_LISTEN, TCP_TIME_WAIT) or ports != (int(peer[1]), int(local[1])):
        return None  # a listener on that port (the kernel's fallback), or a closed socket (uid 0): not the peer's
    uid, inode = struct.unpack_from("=II", reply, NLMSG_HEADER.size + UID_AT)
    return int(uid), int(inode)


def peer_lookup_works() -> bool:
    """Whether this system answers :func:`local_peer_uid` (Linux with netlink sock_diag): a peer it does not find
    there is no peer of this machine's own network namespace that it can vouch for (one whose socket is bound to a
    device, ``SO_BINDTODEVICE``, which the exact lookup skips; one closed before the lookup; another namespace),
    and a listener serving its own user only refuses it."""
    if not hasattr(socket, "AF_NETLINK"):
        return False
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG):
            return True
    except OSError:
        return False


def _addresses(peer: str, local: str) -> tuple[int, bytes, bytes]:
    """``(family, peer, local)`` as ``inet_diag_sockid`` holds them (16 bytes each); IPv4-mapped IPv6 addresses as
    IPv4 (their sockets are IPv4 sockets)."""
    first, second = ipaddress.ip_address(peer.split("%")[0]), ipaddress.ip_address(local.split("%")[0])
    if isinstance(first, ipaddress.IPv6Address) and first.ipv4_mapped is not None:
        first = first.ipv4_mapped
    if isinstance(second, ipaddress.IPv6Address) and second.ipv4_mapped is not None:
        second = second.ipv4_mapped
    family = socket.AF_INET if first.version == 4 else socket.AF_INET6
    return family, first.packed.ljust(16, b"\0"), second.packed.ljust(16, b"\0")
