"""Asks a Spark block manager for a block the way a peer without Spark's
secret would: one `OpenBlocks` RPC (Spark's block transfer protocol, no
authentication handshake first) on a fresh connection, and reports Spark's
answer.

Usage: spark_block_fetch.py '{"host": …, "port": …, "block": …}'. Prints one JSON object:
{"reply": "response" | "failure" | "closed", "message": str}. A "response"
is a stream handle: the block would follow. Without spark.authenticate, a
missing block is a "failure" naming it; with it, the RPC is refused before
any block is looked up.
"""

import json
import socket
import struct
import sys

RPC_REQUEST, RPC_RESPONSE, RPC_FAILURE = 3, 4, 5
OPEN_BLOCKS = 0


def string(s):
    b = s.encode()
    return struct.pack(">i", len(b)) + b


def open_blocks(block_id):
    """An RpcRequest frame carrying BlockTransferMessage OpenBlocks(app, exec, [block])."""
    body = bytes([OPEN_BLOCKS]) + string("app") + string("driver") + struct.pack(">i", 1) + string(block_id)
    header = bytes([RPC_REQUEST]) + struct.pack(">qi", 1, len(body))
    return struct.pack(">q", 8 + len(header) + len(body)) + header + body


def read_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def main():
    args = json.loads(sys.argv[1])
    host, port, block_id = args["host"], int(args["port"]), args["block"]
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(open_blocks(block_id))
        try:
            head = read_exact(sock, 9)
        except ConnectionResetError:
            head = None
        if head is None:
            print(json.dumps({"reply": "closed", "message": ""}))
            return
        length, kind = struct.unpack(">qb", head)
        rest = read_exact(sock, length - 9) or b""
        if kind == RPC_FAILURE:
            (n,) = struct.unpack(">i", rest[8:12])
            print(json.dumps({"reply": "failure", "message": rest[12:12 + n].decode(errors="replace")}))
        elif kind == RPC_RESPONSE:
            print(json.dumps({"reply": "response", "message": rest[12:].hex()}))
        else:
            print(json.dumps({"reply": f"message type {kind}", "message": rest.hex()}))


if __name__ == "__main__":
    main()
