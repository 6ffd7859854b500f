#!/bin/sh
# Issue 15's vtprotobuf trial, Go benchmarks: BenchmarkCodec of src/service
# in two builds, the plain one ("ours") and one whose codec encodes with the
# vtprotobuf code go-control-plane ships ("vtproto": -tags vtprotobuf and
# the overlay in vtcodec/), run in turn ROUNDS times (default 7). Each
# build measures the service's codec and grpc-go's proto codec one right
# after the other (which first alternates), so the ratio of the two is the
# figure that the machine's load moves least: about 1 in the plain build
# (the same encoder), the vtproto encoder's gain in the other. Run from
# anywhere in the repository:
#
#	tools/libtrial/codec.sh
set -eu
cd "$(git rev-parse --show-toplevel)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go test -c -o "$dir/ours.test" ./src/service
go test -c -tags vtprotobuf -overlay tools/libtrial/vtcodec/overlay.json -o "$dir/vtproto.test" ./src/service
# The overlay's encoder must give grpc-go's bytes.
(cd src/service && "$dir/vtproto.test" -test.run '^TestCodecEncodesAsGRPC$' >/dev/null)
for round in $(seq "${ROUNDS:-7}"); do
	# The two codecs of a build run in one process, one after the other;
	# which goes first alternates with the rounds.
	order="grpc-proto service"
	[ $((round % 2)) -eq 0 ] && order="service grpc-proto"
	for v in ours vtproto; do
		for c in $order; do
			(cd src/service && "$dir/$v.test" -test.run '^$' -test.bench "^BenchmarkCodec\$/.*/.*/$c\$" -test.benchmem -test.benchtime "${BENCHTIME:-200000x}") |
				awk -v v="$v" -v r="$round" '/^BenchmarkCodec\// { sub(/-[0-9]+$/, "", $1); print r, v, $1, $3, $5, $7 }'
		done
	done
done >"$dir/raw"
awk '
function median(s,   n, a, i, j, t) {
	n = split(s, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{
	split($3, p, "/") # BenchmarkCodec step ndesc codec
	k = $2 " " p[2] " " p[3]
	ns[k, p[4]] = ns[k, p[4]] " " $4
	allocs[k, p[4]] = $6
	val[$1, k, p[4]] = $4
	keys[k] = 1
	rounds[$1] = 1
}
END {
	print "| build | step | descriptors | grpc-go proto codec ns/op | service codec ns/op | service / grpc-go (median of per-round ratios) | allocs/op (both) |"
	print "|---|---|--:|--:|--:|--:|--:|"
	for (k in keys) {
		r = ""
		for (i in rounds) r = r " " val[i, k, "service"] / val[i, k, "grpc-proto"]
		split(k, f, " ")
		printf "| %s | %s | %s | %.0f | %.0f | %.2f | %s |\n", f[1], f[2], substr(f[3], 1, 1), median(ns[k, "grpc-proto"]), median(ns[k, "service"]), median(r), allocs[k, "service"]
	}
}' "$dir/raw" | { read -r h; read -r s; echo "$h"; echo "$s"; sort; }
