package spool

import (
	"log/slog"
	"os"
	"testing"
)

func openTestDisk(t *testing.T, fsync string, segSize int64) *diskStore {
	t.Helper()
	d, _, err := openDisk(Config{Dir: t.TempDir(), Fsync: fsync, Logger: slog.New(slog.DiscardHandler)}, segSize)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Both stores keep one contract, the one Queue is written against: what
// is written reads back in seq order past any seq, usage counts what is
// above head, oldest names the oldest whole samples above head, release
// forgets up to head.
func TestStoresKeepOneContract(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T) store
	}{
		{"memory", func(*testing.T) store { return new(memStore) }},
		{"disk", func(t *testing.T) store { return openTestDisk(t, FsyncNever, 1<<10) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			defer s.close()
			// 1..100 and 201..300 (100 numbers never written between:
			// a restart's skip), records of 10 samples.
			for _, from := range []uint64{1, 201} {
				for f := from; f < from+100; f += 10 {
					if err := s.write(mkBatch(f, int(f%7), 10)); err != nil {
						t.Fatal(err)
					}
				}
			}
			all, corrupt, err := s.read(0, 300, 1000, nil)
			if err != nil || corrupt != 0 || len(all) != 200 || all[0].Seq != 1 || all[99].Seq != 100 || all[100].Seq != 201 || all[199].Seq != 300 {
				t.Fatalf("read all: %d samples, corrupt %d, err %v", len(all), corrupt, err)
			}
			if want := mkBatch(251, 251%7, 10)[0]; all[150] != want {
				t.Fatalf("sample 251 read back as %+v, want %+v", all[150], want)
			}
			if got, _, _ := s.read(150, 300, 5, nil); len(got) != 5 || got[0].Seq != 201 || got[4].Seq != 205 {
				t.Fatalf("read after 150: %v", got)
			}
			u := s.usage(0)
			if u.samples != 200 || u.bytes <= 0 || u.last != 300 {
				t.Fatalf("usage: %+v", u)
			}
			u50 := s.usage(50)
			if u50.samples != 150 || u50.bytes >= u.bytes || u50.last != 300 {
				t.Fatalf("usage above 50: %+v (all: %+v)", u50, u)
			}
			// A quarter of the bytes above 50: the oldest samples above 50 go.
			drop, left := s.oldest(50, u50.bytes/4)
			var n uint64
			for i, r := range drop {
				if r.First > r.Last || (i > 0 && r.First <= drop[i-1].Last) {
					t.Fatalf("ranges not ascending: %v", drop)
				}
				n += r.Last - r.First + 1
			}
			if len(drop) == 0 || drop[0].First != 51 || left > 0 || n < 20 || n > 60 {
				t.Fatalf("oldest(50, %d): %v (%d samples), left %d", u50.bytes/4, drop, n, left)
			}
			s.release(100)
			if u := s.usage(100); u.samples != 100 || u.last != 300 {
				t.Fatalf("usage after release(100): %+v", u)
			}
			if got, _, _ := s.read(100, 300, 1000, nil); len(got) != 100 || got[0].Seq != 201 {
				t.Fatalf("read after release: %d samples", len(got))
			}
			if err := s.checkpoint(100, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A batched sync handed over (Run runs it after releasing the writer lock)
// while the next write rolls the segment: the roll syncs the segment before
// closing it, or its writes would never be synced.
func TestRollSyncsAHandedOverSync(t *testing.T) {
	d := openTestDisk(t, FsyncBatched, 1<<10)
	defer d.close()
	synced := make(map[string]int) // one goroutine: no lock
	d.fsync = func(f *os.File) error { synced[f.Name()]++; return f.Sync() }
	if err := d.write(mkBatch(1, 1, 100)); err != nil { // more than 1 KiB: the next write rolls
		t.Fatal(err)
	}
	first := d.wf.Name()
	sync := d.syncer()
	if sync == nil || d.syncer() != nil {
		t.Fatal("syncer: want one sync for the written segment, then none")
	}
	if err := d.write(mkBatch(101, 1, 10)); err != nil {
		t.Fatal(err)
	}
	if d.wf.Name() == first || synced[first] != 1 {
		t.Fatalf("after the roll: active %s, syncs of the full segment %d, want 1", d.wf.Name(), synced[first])
	}
	sync() // on the closed file: os.ErrClosed, nothing to do
	if synced[first] != 2 || d.dirty != true {
		t.Fatalf("handed-over sync: %d syncs of the full segment, new segment dirty %v", synced[first], d.dirty)
	}
}
