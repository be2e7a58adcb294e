package receiver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"edgegw/ringstore"
	"edgegw/wire"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the version of the schema the receiver creates and
// expects (the row of edgegw_schema_version).
const SchemaVersion = 1

// migrations[i] takes the schema from version i to i+1, in one transaction.
var migrations = []string{`
CREATE TABLE edgegw_samples (
	gateway     text             NOT NULL,
	epoch       text             NOT NULL,
	seq         bigint           NOT NULL,
	device      text             NOT NULL,
	tag         text             NOT NULL,
	value       double precision,
	value_text  text,
	quality     text             NOT NULL,
	ts          timestamptz      NOT NULL,
	received_at timestamptz      NOT NULL DEFAULT now(),
	PRIMARY KEY (gateway, epoch, seq)
);
CREATE INDEX edgegw_samples_tag_ts ON edgegw_samples (gateway, device, tag, ts);
CREATE TABLE edgegw_epochs (
	gateway    text        NOT NULL,
	epoch      text        NOT NULL,
	first_seq  bigint      NOT NULL,
	first_seen timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (gateway, epoch)
);
CREATE TABLE edgegw_ranges (
	gateway     text        NOT NULL,
	epoch       text        NOT NULL,
	first_seq   bigint      NOT NULL,
	last_seq    bigint      NOT NULL,
	kind        text        NOT NULL CHECK (kind IN ('skip', 'loss')),
	reason      text        NOT NULL DEFAULT '',
	received_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (gateway, epoch, first_seq, last_seq, kind)
);
CREATE TABLE edgegw_connections (
	gateway  text        PRIMARY KEY,
	receiver text        NOT NULL,
	remote   text        NOT NULL,
	since    timestamptz NOT NULL DEFAULT now()
);
`}

// The temporary table a batch is copied into, one per database session,
// emptied at each commit.
const createStage = `CREATE TEMP TABLE IF NOT EXISTS edgegw_stage (
	gateway text, epoch text, seq bigint, device text, tag text,
	value double precision, value_text text, quality text, ts timestamptz
) ON COMMIT DELETE ROWS`

var stageCols = []string{"gateway", "epoch", "seq", "device", "tag", "value", "value_text", "quality", "ts"}

// store writes batches to PostgreSQL: every batch in one transaction, so
// that the ack (sent after the commit) means stored, and resends die at the
// primary key whichever receiver takes them.
type store struct {
	pool *pgxpool.Pool
	id   string // this receiver, as edgegw_connections names it
}

// openStore connects to url and brings the schema to SchemaVersion.
func openStore(ctx context.Context, url, id string) (*store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("receiver: -postgres: %w", err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, createStage)
		return err
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("receiver: postgres: %w", err)
	}
	s := &store{pool: pool, id: id}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *store) close() { s.pool.Close() }

// migrate applies the migrations the database lacks, each in its own
// transaction under an advisory lock, so that receivers starting together
// apply each one once.
func (s *store) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("receiver: postgres: %w", err)
	}
	defer conn.Release()
	const lock int64 = 0x656467656777 // "edgegw" (int64: PostgreSQL's bigint, and the lab builds for armv7 too)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock); err != nil {
		return fmt.Errorf("receiver: postgres: %w", err)
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, lock) //nolint:errcheck // the session ends with the lock anyway
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS edgegw_schema_version (version int NOT NULL)`); err != nil {
		return fmt.Errorf("receiver: postgres: schema: %w", err)
	}
	var v int
	err = conn.QueryRow(ctx, `SELECT version FROM edgegw_schema_version`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err = conn.Exec(ctx, `INSERT INTO edgegw_schema_version VALUES (0)`); err != nil {
			return fmt.Errorf("receiver: postgres: schema: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("receiver: postgres: schema: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("receiver: postgres: schema version %d is newer than this receiver's %d", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE edgegw_schema_version SET version = $1`, v+1)
			return err
		})
		if err != nil {
			return fmt.Errorf("receiver: postgres: migration to schema version %d: %w", v+1, err)
		}
	}
	return nil
}

// writeResult is what a batch's transaction stored.
type writeResult struct {
	inserted, duplicates int64
	newEpoch             bool
	losses, lostSamples  uint64 // loss ranges new to the database, and their size
}

// write stores one batch in one transaction: COPY into the session's stage
// table, INSERT … SELECT … ON CONFLICT DO NOTHING into edgegw_samples (rows
// copied minus rows inserted are the duplicates), the epoch and the skip
// and loss ranges. Nothing is stored unless all of it is.
func (s *store) write(ctx context.Context, f *wire.Batch) (res writeResult, err error) {
	rows := make([][]any, len(f.Samples))
	for i := range f.Samples {
		sm := &f.Samples[i]
		if sm.Seq > math.MaxInt64 {
			return res, &badBatch{fmt.Sprintf("seq %d does not fit a bigint", sm.Seq)}
		}
		rows[i] = sampleRow(f, sm)
	}
	for _, k := range f.Skip {
		if k.Last > math.MaxInt64 {
			return res, &badBatch{fmt.Sprintf("skip [%d,%d] does not fit a bigint", k.First, k.Last)}
		}
	}
	for _, l := range f.Loss {
		if l.Last > math.MaxInt64 {
			return res, &badBatch{fmt.Sprintf("loss [%d,%d] does not fit a bigint", l.First, l.Last)}
		}
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if len(rows) > 0 {
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"edgegw_stage"}, stageCols, pgx.CopyFromRows(rows))
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `INSERT INTO edgegw_samples (gateway, epoch, seq, device, tag, value, value_text, quality, ts)
				SELECT gateway, epoch, seq, device, tag, value, value_text, quality, ts FROM edgegw_stage
				ON CONFLICT DO NOTHING`)
			if err != nil {
				return err
			}
			res.inserted = tag.RowsAffected()
			res.duplicates = n - res.inserted
		}
		first := f.First
		if len(f.Samples) > 0 {
			first = min(first, f.Samples[0].Seq)
		}
		// xmax = 0: the row was inserted, not updated (a new epoch); the
		// row is updated only when this batch starts below its first seq.
		if err := tx.QueryRow(ctx, `INSERT INTO edgegw_epochs (gateway, epoch, first_seq) VALUES ($1, $2, $3)
			ON CONFLICT (gateway, epoch) DO UPDATE SET first_seq = EXCLUDED.first_seq WHERE EXCLUDED.first_seq < edgegw_epochs.first_seq
			RETURNING (xmax = 0)`, f.Gateway, f.Epoch, int64(first)).Scan(&res.newEpoch); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err // no row: the epoch is known and starts no later
		}
		for _, k := range f.Skip {
			if _, err := tx.Exec(ctx, `INSERT INTO edgegw_ranges (gateway, epoch, first_seq, last_seq, kind) VALUES ($1, $2, $3, $4, 'skip')
				ON CONFLICT DO NOTHING`, f.Gateway, f.Epoch, int64(k.First), int64(k.Last)); err != nil {
				return err
			}
		}
		for _, l := range f.Loss {
			epoch := l.Epoch
			if epoch == "" {
				epoch = f.Epoch
			}
			tag, err := tx.Exec(ctx, `INSERT INTO edgegw_ranges (gateway, epoch, first_seq, last_seq, kind, reason) VALUES ($1, $2, $3, $4, 'loss', $5)
				ON CONFLICT DO NOTHING`, f.Gateway, epoch, int64(l.First), int64(l.Last), l.Reason)
			if err != nil {
				return err
			}
			if tag.RowsAffected() > 0 {
				res.losses++
				res.lostSamples += l.Last - l.First + 1
			}
		}
		return nil
	})
	if err != nil {
		return writeResult{}, fmt.Errorf("receiver: postgres: %w", err)
	}
	return res, nil
}

// sampleRow is a sample as a row of the stage table: value NULL unless the
// sample is good and numeric (a bool is 0 or 1), value_text for a string tag.
func sampleRow(f *wire.Batch, s *ringstore.Sample) []any {
	q := s.EffectiveQuality()
	var value, text any
	switch {
	case s.Kind == ringstore.KindString:
		t := ""
		if s.Text != nil {
			t = *s.Text
		}
		text = t
	case q == ringstore.Good:
		value = s.Value
	}
	return []any{f.Gateway, f.Epoch, int64(s.Seq), s.Device, s.Tag, value, text, q.String(), time.UnixMicro(s.TS)}
}

// connect records that gateway is connected to this receiver (the latest
// connection wins, whichever receiver holds it).
func (s *store) connect(ctx context.Context, gateway, remote string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO edgegw_connections (gateway, receiver, remote) VALUES ($1, $2, $3)
		ON CONFLICT (gateway) DO UPDATE SET receiver = EXCLUDED.receiver, remote = EXCLUDED.remote, since = now()`, gateway, s.id, remote)
	return err
}

// disconnect removes gateway's record if it is still this receiver's.
func (s *store) disconnect(ctx context.Context, gateway string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM edgegw_connections WHERE gateway = $1 AND receiver = $2`, gateway, s.id)
	return err
}

// forget removes every record of this receiver: at start, the ones a
// receiver of the same id left when it died.
func (s *store) forget(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM edgegw_connections WHERE receiver = $1`, s.id)
	return err
}

// connection is a gateway's record in edgegw_connections.
type connection struct {
	Receiver, Remote string
	Since            time.Time
}

// where returns the gateway's connection record (ok false: none).
func (s *store) where(ctx context.Context, gateway string) (c connection, ok bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT receiver, remote, since FROM edgegw_connections WHERE gateway = $1`, gateway).Scan(&c.Receiver, &c.Remote, &c.Since)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	return c, err == nil, err
}

// Hole is a run of seqs of one (gateway, epoch) that the database holds
// neither as samples nor as skip or loss ranges, between two runs it holds.
type Hole struct {
	Gateway, Epoch string
	First, Last    uint64
}

// gapsSQL finds the holes: the samples are grouped into runs of
// consecutive seqs (seq minus its row number is constant along a run), the
// runs and the announced ranges are ordered by their first seq, and a hole
// is where a span starts more than one above the highest seq of every span
// before it (a running max over the partition, so that overlapping ranges
// and runs hide nothing). $1 is a gateway ("" = all), $2 the earliest ts
// of the samples looked at: holes below a partition's first sample since
// then are not reported.
const gapsSQL = `
WITH s AS (
	SELECT gateway, epoch, seq,
		seq - row_number() OVER (PARTITION BY gateway, epoch ORDER BY seq) AS run
	FROM edgegw_samples
	WHERE ($1 = '' OR gateway = $1) AND ts >= $2
), runs AS (
	SELECT gateway, epoch, min(seq) AS first, max(seq) AS last, count(*) AS n FROM s GROUP BY gateway, epoch, run
), lo AS (
	SELECT gateway, epoch, min(first) AS lo, sum(n) AS n FROM runs GROUP BY gateway, epoch
), spans AS (
	SELECT gateway, epoch, first, last FROM runs
	UNION ALL
	SELECT r.gateway, r.epoch, r.first_seq, r.last_seq FROM edgegw_ranges r JOIN lo USING (gateway, epoch)
), ordered AS (
	SELECT gateway, epoch, first,
		max(last) OVER (PARTITION BY gateway, epoch ORDER BY first, last ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
	FROM spans
)
SELECT o.gateway, o.epoch, o.before + 1, o.first - 1
FROM ordered o JOIN lo USING (gateway, epoch)
WHERE o.first > o.before + 1 AND o.before + 1 > lo.lo
ORDER BY 1, 2, 3`

// GapReport is what Gaps found.
type GapReport struct {
	Holes    []Hole
	Epochs   int    // (gateway, epoch) pairs with samples looked at
	Samples  uint64 // samples looked at
	Missing  uint64 // seqs in the holes
	Announce int    // skip and loss ranges in those pairs
}

// Gaps reports the holes per (gateway, epoch) in the database at url, for
// gateway ("" = every one) and samples with ts at or after since.
func Gaps(ctx context.Context, url, gateway string, since time.Time) (*GapReport, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("receiver: postgres: %w", err)
	}
	defer conn.Close(context.Background())
	rep := &GapReport{}
	rows, err := conn.Query(ctx, gapsSQL, gateway, since)
	if err != nil {
		return nil, fmt.Errorf("receiver: gaps: %w", err)
	}
	for rows.Next() {
		var h Hole
		var a, b int64
		if err := rows.Scan(&h.Gateway, &h.Epoch, &a, &b); err != nil {
			return nil, fmt.Errorf("receiver: gaps: %w", err)
		}
		h.First, h.Last = uint64(a), uint64(b)
		rep.Missing += h.Last - h.First + 1
		rep.Holes = append(rep.Holes, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("receiver: gaps: %w", err)
	}
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(DISTINCT (gateway, epoch)), count(*),
		(SELECT count(*) FROM edgegw_ranges r WHERE ($1 = '' OR r.gateway = $1) AND (r.gateway, r.epoch) IN
			(SELECT gateway, epoch FROM edgegw_samples WHERE ($1 = '' OR gateway = $1) AND ts >= $2))
		FROM edgegw_samples WHERE ($1 = '' OR gateway = $1) AND ts >= $2`, gateway, since).Scan(&rep.Epochs, &n, &rep.Announce)
	if err != nil {
		return nil, fmt.Errorf("receiver: gaps: %w", err)
	}
	rep.Samples = uint64(n)
	return rep, nil
}
