// The soak's uplink: the reference receiver, cut and restored.

package bench

import (
	"context"
	"time"

	"edgegw/receiver"
)

// uplink is the reference receiver, in this process, cut and restored on
// the same address; its dedup state survives a cut.
type uplink struct {
	r      *receiver.Receiver
	cancel context.CancelFunc
	done   chan error
}

func (u *uplink) up(ctx context.Context) error {
	var err error
	for range 50 { // the port was ours a moment ago; another bind may hold it briefly
		if _, err = u.r.Listen(); err == nil {
			break
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(context.Background())
	u.cancel, u.done = cancel, make(chan error, 1)
	go func() { u.done <- u.r.Serve(sctx) }()
	return nil
}

func (u *uplink) down() error {
	if u.cancel == nil {
		return nil
	}
	u.cancel()
	err := <-u.done
	u.cancel = nil
	return err
}
