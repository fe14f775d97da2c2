"""The SMS flood of issue #43: concurrent ClassifySms requests of ~4 MB,
each 1,000,000 near-empty history entries, against a running server; prints
the server's resident set before, at its peak during, and after the flood.

    python3 bench/attacks/sms_flood.py --addr 127.0.0.1:50051 --pid PID

Needs grpcio (the test venv in target/test-deps has it). The message is
built as raw protobuf bytes, so no stubs are needed and the client holds
one copy of it; the server's answer is printed per status code.
"""

import argparse
import collections
import concurrent.futures
import threading
import time

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, wire_type, payload):
    key = varint((number << 3) | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def request(entries):
    context = field(1, 2, field(1, 2, b"t1"))  # RequestContext{team_id}
    message = field(3, 2, b"hello")
    # SmsMessage{direction: 1}: 4 bytes on the wire per entry.
    entry = field(4, 2, field(1, 0, varint(1)))
    return context + message + entry * entries


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()

    body = request(args.entries)
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    channel = grpc.insecure_channel(args.addr, options=options)
    call = channel.unary_unary("/ai.orchestrator.v1.Orchestrator/ClassifySms")

    before = rss_kib(args.pid)
    peak = [before]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(args.pid))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    codes = collections.Counter()

    def one(_):
        try:
            call(body, timeout=60)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name

    with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
        for _ in range(args.rounds):
            codes.update(pool.map(one, range(args.concurrent)))
    done.set()
    watcher.join()
    time.sleep(2)
    after = rss_kib(args.pid)
    print(f"request: {len(body)} bytes, {args.entries} entries; "
          f"{args.rounds} rounds of {args.concurrent} at once")
    print(f"answers: {dict(codes)}")
    print(f"server RSS: before {before / 1024:.0f} MiB, peak {peak[0] / 1024:.0f} MiB, "
          f"2 s after {after / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
