#!/bin/sh
# Writes the hand-written seed inputs into corpus/<target>/seed-<name>.
# Idempotent; run from anywhere. The rest of each corpus is what libFuzzer
# found, minimized with `cargo fuzz cmin` (see README.md).
set -eu
cd "$(dirname "$0")"
mkdir -p corpus/endpoint_key corpus/peer_spec corpus/duration corpus/state_key corpus/batcher

# seed <target> <name> <bytes, printf format>
seed() { printf -- "$3" > "corpus/$1/seed-$2"; }

R=/aether/v1/regions
E=endpoint_key
seed $E v4           "$R/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7"
seed $E v6           "$R/us-east/clusters/c/services/s/protocols/http/endpoints/fd00::1"
seed $E v6-zone      "$R/us-east/clusters/c/services/s/protocols/http/endpoints/fe80::1%%eth0"
seed $E v6-mapped    "$R/us-east/clusters/c/services/s/protocols/http/endpoints/::ffff:10.0.0.1"
seed $E literals     "$R/clusters/clusters/services/services/protocols/protocols/endpoints/endpoints/regions"
seed $E custom-root  "/x/y/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7"
seed $E short-root   "/r/a/clusters/b/services/c/protocols/d/endpoints/e"
seed $E unicode      "$R/région/clusters/ç/services/s ví/protocols/µ/endpoints/10.0.0.1"
seed $E control      "$R/e\000w/clusters/c\n/services/s\t/protocols/p /endpoints/1\r"
seed $E trailing-slash "$R/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7/"
seed $E extra-seg    "$R/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7/x"
seed $E empty-seg    "$R/eu-west/clusters//services/checkout/protocols/grpc/endpoints/10.0.0.7"
seed $E wrong-literal "$R/eu-west/cluster/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7"
seed $E missing-ip   "$R/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/"
seed $E region-prefix "$R/eu-west/"
seed $E state-key    "$R/eu-west/_state/heartbeat"
seed $E root-only    "$R/"
seed $E no-root      "/aether/v1/eu-west/clusters/c/services/s/protocols/p/endpoints/1.2.3.4"
seed $E legacy       "/registry/checkout/protocols/grpc/endpoints/10.0.0.7"
seed $E not-utf8     "$R/eu-west/clusters/c/services/s/protocols/p/endpoints/\377\376"
seed $E region-not-utf8 "$R/\377r/clusters/c/services/s/protocols/p/endpoints/1"

# The value after --peer-etcd= / --peer-tls= / --peer-auth= (the target tries all three).
P=peer_spec
seed $P two-urls     "b=http://127.0.0.1:2379,https://[::1]:2379"
seed $P http         "b=http://127.0.0.1:2379"
seed $P https        "b=https://etcd-b.example:2379"
seed $P v6           "b=http://[fd00::1]:2379,http://[fd00::2]:2379/"
seed $P multi        "b=http://10.0.0.1:2379;c=http://10.0.0.2:2379"
seed $P dup          "b=http://h:1,http://H:1/"
seed $P self         "a=http://10.0.0.1:2379"
seed $P no-eq        "http://127.0.0.1:2379"
seed $P empty-region "=http://127.0.0.1:2379"
seed $P slash-region "b/c=http://127.0.0.1:2379"
seed $P empty-list   "b= , ,"
seed $P bad-urls     "b=ftp://h:1,http://u@h:1,http://h:0,http://h:65536,http://h:1/p?q#f,http://:1"
seed $P tls-full     "b=ca=/etc/hosts,cert=/etc/hosts,key=/etc/hosts,server-name=etcd-b"
seed $P tls-ca       "b=ca=/nonexistent/ca.pem"
seed $P tls-dir      "b=ca=/tmp"
seed $P tls-bad      "b=cert=/etc/hosts,bogus,=x,server-name="
seed $P tls-peers    "z=ca=/etc/hosts;b=server-name=x;b=server-name=y"
seed $P auth         "b=user:pa:ss=word"
seed $P auth-bad     "b=user;b=:p;b=u:;user:pass=word;=x"
seed $P delims       ";;=;,"

# Durations (parse_duration) and sizes (parse_byte_size); the target tries both.
D=duration
seed $D 30s 30s;        seed $D 1m30s 1m30s;    seed $D 500ms 500ms
seed $D 1.5s 1.5s;      seed $D 0s 0s;          seed $D neg -1s
seed $D all-units 1h2m3s4ms5us6ns;              seed $D micro "10\302\265s"
seed $D 1e-18 1.000000000000000001s;            seed $D half-ns 0.5ns
seed $D 1.5h 1.5h;      seed $D u64-overflow 18446744073709551616s
seed $D u128-max 340282366920938463463374607431768211455h
seed $D repeated 1s1s;  seed $D wrong-order 1s1m
seed $D unitless 1;     seed $D unit-only s;    seed $D dot .
seed $D dot-end 1.;     seed $D dot-start .5s;  seed $D exp 1e3s
seed $D lead-space " 1s"; seed $D mid-space "1 s"; seed $D upper 1S
seed $D bytes 1572864;  seed $D kib 512KiB;     seed $D mib 1.5MiB
seed $D gib 1GiB;       seed $D b 4096B;        seed $D kb 1KB
seed $D mb 1mb;         seed $D half-b 0.5B;    seed $D space-mib "1 MiB"
seed $D big-gib 99999999999999999999GiB;        seed $D fine-kib 1.0000000000000000001KiB

# State key values (State::decode). Long enough (56 bytes and more) that the
# target also builds a state from their first bytes and round-trips it.
S=state_key
seed $S full         "v1 revision=42 lease=7587869230000000123 holder=00000000deadbeef source=cdf818194e3a8c32 origin=123456789abcdef1 heartbeat=1796000000123 synced=1 ttl=30"
seed $S oldest       "v1 revision=9 lease=3 holder=00000000000000aa"
seed $S before-ttl   "v1 revision=9 lease=3 holder=00000000000000aa source=0000000000000001 origin=0000000000000002 heartbeat=5 synced=1"
seed $S later-field  "v1 revision=9 lease=3 holder=aa ttl=7 future=x"
seed $S unsynced     "v1 revision=0 lease=0 holder=1 source=0 origin=0 heartbeat=0 synced=0 ttl=0"
seed $S neg-ttl      "v1 revision=-1 lease=-1 holder=ffffffffffffffff heartbeat=-5 ttl=-5"
seed $S extremes     "v1 revision=9223372036854775807 lease=-9223372036854775808 holder=ffffffffffffffff ttl=9223372036854775807"
seed $S overflow     "v1 revision=9223372036854775808 lease=1 holder=10000000000000000"
seed $S signs        "v1 revision=+1 lease=+1 holder=+a source=+b origin=+c heartbeat=+1 ttl=+1"
seed $S dup-field    "v1 revision=1 revision=2 lease=1 holder=1 holder=2"
seed $S bad-ttl      "v1 revision=1 lease=1 holder=1 ttl=x"
seed $S bad-source   "v1 revision=1 lease=1 holder=1 source=xyz"
seed $S no-eq        "v1 revision=1 lease=1 holder=1 junk"
seed $S two-spaces   "v1  revision=1 lease=1 holder=1"
seed $S trailing     "v1 revision=1 lease=1 holder=1 "
seed $S missing      "v1 lease=1 holder=1 synced=1 ttl=30"
seed $S v2           "v2 revision=1 lease=1 holder=1"
seed $S not-utf8     "v1 revision=1 lease=1 holder=\377"

# Scripts for the batcher target (see Script::run in fuzz_targets/batcher.rs):
# two bytes of limits (max_ops = 2 + o % 15, max_bytes = 4096 + b * 64), then
# commands: put 0 k len/24, delete 4 k, next revision 5 gap, end of response
# 6 (+8 flush, +16 pop all, +32 pop one), new limits 7 o b.
B=batcher
# Single-put revisions into one batch, then de-duplicated rewrites of a key.
seed $B coalesce     "\006\000\000\001\004\005\000\000\002\004\005\000\000\003\004\036"
seed $B dedup        "\006\000\000\001\004\005\000\000\001\010\005\000\004\001\005\000\000\001\001\036"
# One revision over the op limit (one data op per txn), then over the byte
# limit (three puts of 1440 bytes, 2560 to a txn), then one op too large.
seed $B split-ops    "\000\000\000\001\001\000\002\001\000\003\001\004\004\036"
seed $B split-bytes  "\015\000\000\001\074\000\002\074\000\003\074\005\000\000\004\001\036"
seed $B too-large    "\015\000\000\001\310\005\000\000\002\001\036"
# A rewrite of a key in the same revision starts the next one; revisions
# with gaps; batches popped one at a time, before the flush.
seed $B same-key     "\006\000\000\001\001\000\001\002\004\001\036"
seed $B gaps         "\006\000\000\001\001\005\003\000\002\001\005\002\000\003\001\046\036"
seed $B pop-one      "\000\000\000\001\001\000\002\001\000\003\001\046\046\006\036"
# The peer's limits lowered, then raised, between responses.
seed $B set-limits   "\016\377\000\001\100\000\002\100\000\003\100\006\007\000\000\000\004\001\000\005\001\007\016\377\000\006\001\036"
seed $B no-flush     "\006\000\000\001\001\006\000\002\001\006"
