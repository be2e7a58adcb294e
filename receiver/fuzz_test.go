package receiver

import (
	"bytes"
	"testing"

	"edgegw/wire"
)

// FuzzReceiverIngest (`go test -fuzz FuzzReceiverIngest ./receiver/`): the
// receiver's batch parse and dedup. No input panics; a refused frame is
// counted and writes nothing; an accepted one writes each sample once.
func FuzzReceiverIngest(f *testing.F) {
	f.Add(batch(1, 5, 6))
	f.Add(batch(1, 7, 7, wire.Range{First: 2, Last: 4}))
	f.Add(batch(0, 1, 70))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":1,"last":1,"samples":[{"seq":1,"device":"d","tag":"t","value":null,"quality":"good","ts":0}]}`))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":1,"last":3,"samples":[null,null,null]}`))
	f.Add([]byte(`{"type":"write_result","id":"1","ok":true}`))
	f.Add([]byte{})
	const maxBatch = 64
	f.Fuzz(func(t *testing.T, frame []byte) {
		var out bytes.Buffer // Ingest writes from this goroutine only
		r := New(Config{Out: &out, MaxBatch: maxBatch, MaxPending: 16})
		last, err := r.Ingest(frame)
		if err != nil {
			if st := r.Stats(); st.BadFrames != 1 || st.Samples != 0 || out.Len() != 0 {
				t.Fatalf("refused frame, stats %+v, output %q", st, out.String())
			}
			return
		}
		b, _ := wire.ParseBatch(frame, maxBatch)
		if b == nil || last != b.Last {
			t.Fatalf("accepted frame: last %d, parsed %+v", last, b)
		}
		// Every sample of an accepted batch is new once (seqs strictly increase),
		// and a second ingest of the same frame writes nothing.
		if st := r.Stats(); st.Samples != uint64(len(b.Samples)) || st.Duplicates != 0 || bytes.Count(out.Bytes(), []byte("\n")) != len(b.Samples) {
			t.Fatalf("stats %+v for %d samples", st, len(b.Samples))
		}
		if _, err := r.Ingest(frame); err != nil {
			t.Fatal(err)
		}
		if st := r.Stats(); st.Samples != uint64(len(b.Samples)) || st.Duplicates != uint64(len(b.Samples)) {
			t.Fatalf("second ingest: stats %+v", st)
		}
	})
}
