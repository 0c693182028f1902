// Test target for reading a Go heap profile: records every allocation,
// leaks 100 blocks of 4096 bytes from leak(), writes DIR/h1.pb.gz, leaks
// 300 more, writes DIR/h2.pb.gz. Go's heap profile is as of the last
// completed GC, so each write follows runtime.GC().
package main

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
)

// Preallocated: leak()'s only allocations are its blocks.
var keep = make([][]byte, 0, 1000)

//go:noinline
func leak(n int) {
	for i := 0; i < n; i++ {
		b := make([]byte, 4096)
		b[0] = 1
		keep = append(keep, b)
	}
}

func dump(path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		panic(err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		panic(err)
	}
	if err := f.Close(); err != nil {
		panic(err)
	}
}

func main() {
	runtime.MemProfileRate = 1
	dir := os.Args[1]
	leak(100)
	dump(filepath.Join(dir, "h1.pb.gz"))
	leak(300)
	dump(filepath.Join(dir, "h2.pb.gz"))
}
