package bench

import (
	"strconv"
	"testing"
	"time"

	"edgegw/internal/pgtest"
)

// A short bench ingest against a real PostgreSQL: samples stored through a
// receiver child, none twice, the \copy floor measured, bytes per sample
// in the range a JSON batch costs, and the database holds what the
// receivers counted.
func TestIngestSmoke(t *testing.T) {
	db := pgtest.Start(t)
	rep, err := RunIngest(t.Context(), IngestConfig{Gateways: 2, Receivers: 2, Batch: 200, Duration: 2 * time.Second, Warmup: time.Second,
		Postgres: db.URL(), Exec: testExec(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Stored == 0 || rep.Duplicates != 0 || rep.CopyRate <= 0 || rep.CommitP99MS <= 0 {
		t.Fatalf("report: %+v", rep)
	}
	if rep.BytesPerSample < 50 || rep.BytesPerSample > 300 {
		t.Errorf("%.1f bytes per sample on the socket: not a JSON batch's", rep.BytesPerSample)
	}
	n, _ := strconv.ParseUint(db.Psql("SELECT count(*) FROM edgegw_samples"), 10, 64)
	if n < rep.Stored {
		t.Errorf("database holds %d samples, the receivers counted %d stored in the measured time", n, rep.Stored)
	}
	if got := db.Psql("SELECT count(*) FROM edgegw_copyfloor"); got != "0" {
		t.Errorf("copy floor table left with %s rows", got)
	}
}
