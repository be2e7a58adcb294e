package sparkplug

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/internal/backoff"
	"edgegw/internal/tlsfile"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
)

// Writer carries out a DCMD write (declared here, implemented in main over
// the edge scheduler's write path: bus goroutine, type and range checks,
// read-back).
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// Device is one device and its tags, in config order.
type Device struct {
	Name     string
	Interval time.Duration
	Tags     []Tag
}

// Config configures New.
type Config struct {
	GroupID       string // required
	NodeID        string // required (main defaults it to the gateway id)
	PrimaryHostID string // "" = no primary host: publish whenever connected
	Writes        bool   // DCMD writes allowed

	Broker             string
	ClientID           string
	Username, Password string
	CAFile             string
	CertFile, KeyFile  string
	ServerName         string
	ReconnectMin       time.Duration // 1s
	ReconnectMax       time.Duration // 30s

	DataDir string // bdSeq and aliases; "" = memory only
	Devices []Device

	Queue    spool.Reader               // required: the node's cursor of the shared queue (or a queue of its own)
	Latest   func() *ringstore.Snapshot // required: current values for the births
	Stats    func() []stats.Entry       // device health records (device death); nil = never dead
	Upstream *stats.Upstream            // for the NBIRTH gateway metrics; nil = none
	Version  string
	Writer   Writer // nil = DCMD writes refused
	Logger   *slog.Logger

	NodeDataEvery time.Duration // NDATA of the gateway metrics (10s)
	CheckEvery    time.Duration // device state check (250ms)
	MaxInFlight   int           // DDATA messages not yet written by paho (256)
	WriteTimeout  time.Duration // per DCMD write (10s)
}

// Node metric names and aliases.
const (
	MetricBdSeq        = "bdSeq"
	MetricRebirth      = "Node Control/Rebirth"
	MetricVersion      = "Node Info/Version"
	MetricUptime       = "Node Info/Uptime"
	MetricUpstream     = "Node Info/Upstream State"
	MetricQueueDepth   = "Node Info/Queue Depth"
	MetricBacklog      = "Node Info/Sparkplug Backlog"
	MetricCmdsRefused  = "Node Info/Commands Refused"
	MetricWritesOn     = "Node Control/Writes Enabled"
	aliasRebirth       = 1
	aliasVersion       = 2
	aliasUptime        = 3
	aliasUpstream      = 4
	aliasQueueDepth    = 5
	aliasBacklog       = 6
	aliasCmdsRefused   = 7
	aliasWritesEnabled = 8
)

// Quality property codes (OPC DA classic, what Ignition reads from a
// Sparkplug "Quality" property).
const (
	QualityGood        = 192
	QualityBad         = 0
	QualityCommFailure = 24
	QualityUncertain   = 64
)

// Node is the Sparkplug B edge node. Create with New, run with Run.
type Node struct {
	cfg     Config
	log     *slog.Logger
	tlsConf *tls.Config
	bd      *bdSeqStore
	state   writeHealth // the writes of bdseq and aliases (WriteHealth)
	devs    []devInfo
	byName  map[string]int
	tags    map[aliasKey]*tagInfo
	byAlias map[uint64]*tagInfo
	start   time.Time
	nsTopic string // spBv1.0/<group>

	writes    chan writeCmd
	refused   atomic.Uint64
	refuseLog backoff.Log   // refused commands: a line at most every 10 s
	unknown   atomic.Uint64 // samples of devices or tags not in the births (reload)
}

type devInfo struct {
	Device
	tags []*tagInfo
}

type tagInfo struct {
	device string
	Tag
	alias    uint64
	datatype uint32
}

// New checks cfg and loads bdSeq and the aliases. It starts nothing.
func New(cfg Config) (*Node, error) {
	if err := CheckID("group_id", cfg.GroupID); err != nil {
		return nil, err
	}
	if err := CheckID("node_id", cfg.NodeID); err != nil {
		return nil, err
	}
	if cfg.PrimaryHostID != "" {
		if err := CheckID("primary_host_id", cfg.PrimaryHostID); err != nil {
			return nil, err
		}
	}
	if cfg.Broker == "" {
		return nil, errors.New("sparkplug: no broker ([upstream.mqtt] broker)")
	}
	if cfg.Queue == nil || cfg.Latest == nil {
		return nil, errors.New("sparkplug: no queue or no latest values")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "edgegw-" + cfg.NodeID + "-sparkplug"
	}
	cfg.ReconnectMin = orDur(cfg.ReconnectMin, time.Second)
	cfg.ReconnectMax = max(orDur(cfg.ReconnectMax, 30*time.Second), cfg.ReconnectMin)
	cfg.NodeDataEvery = orDur(cfg.NodeDataEvery, 10*time.Second)
	cfg.CheckEvery = orDur(cfg.CheckEvery, 250*time.Millisecond)
	cfg.WriteTimeout = orDur(cfg.WriteTimeout, 10*time.Second)
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256
	}
	n := &Node{cfg: cfg, log: cfg.Logger, byName: map[string]int{}, tags: map[aliasKey]*tagInfo{},
		refuseLog: backoff.Log{Every: 10 * time.Second, Level: slog.LevelWarn},
		byAlias:   map[uint64]*tagInfo{}, nsTopic: "spBv1.0/" + cfg.GroupID, writes: make(chan writeCmd, 16)}
	for _, d := range cfg.Devices {
		if err := CheckID("device id", d.Name); err != nil {
			return nil, err
		}
		if _, dup := n.byName[d.Name]; dup {
			return nil, fmt.Errorf("sparkplug: device %q twice", d.Name)
		}
		for _, t := range d.Tags {
			if datatypeOf(t) == TypeUnknown {
				return nil, fmt.Errorf("sparkplug: device %q: tag %q: type %q has no Sparkplug datatype", d.Name, t.Name, t.Type)
			}
		}
	}
	dir := ""
	if cfg.DataDir != "" {
		dir = cfg.DataDir
		if err := os.MkdirAll(dir, 0o750); err != nil {
			// A read-only or full disk: bdSeq and aliases live in memory (logged).
			n.log.Warn("sparkplug: cannot create the directory", "dir", dir, "err", err)
		}
	}
	var err error
	n.bd = openBdSeq(dir, n.log, &n.state)
	aliases := loadAliases(dir, cfg.Devices, n.log, &n.state)
	for _, d := range cfg.Devices {
		di := devInfo{Device: d}
		for _, t := range d.Tags {
			ti := &tagInfo{device: d.Name, Tag: t, alias: aliases[aliasKey{d.Name, t.Name}], datatype: datatypeOf(t)}
			di.tags = append(di.tags, ti)
			n.tags[aliasKey{d.Name, t.Name}] = ti
			n.byAlias[ti.alias] = ti
		}
		n.byName[d.Name] = len(n.devs)
		n.devs = append(n.devs, di)
	}
	if n.tlsConf, err = tlsfile.Client(cfg.CAFile, cfg.CertFile, cfg.KeyFile, cfg.ServerName); err != nil {
		return nil, fmt.Errorf("sparkplug: %w", err)
	}
	return n, nil
}

// WriteHealth is the writer of the node's state in DataDir (bdseq at each
// connection, aliases when tags are added): failing is the error of the
// last state write when it failed (nil once one succeeds), last the last
// such error since New and at when it happened (zero: none).
func (n *Node) WriteHealth() (at time.Time, failing, last error) {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return n.state.lastErrAt, n.state.failing, n.state.lastErr
}

// CheckID refuses an empty id or one with a character Sparkplug forbids in
// a topic level (+ # /).
func CheckID(what, s string) error {
	if s == "" {
		return fmt.Errorf("sparkplug: %s is empty", what)
	}
	if i := strings.IndexAny(s, "+#/\x00"); i >= 0 {
		return fmt.Errorf("sparkplug: %s %q: %q is not allowed in a Sparkplug id", what, s, s[i])
	}
	return nil
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Topic returns spBv1.0/<group>/<typ>/<node>[/<device>].
func (n *Node) Topic(typ, device string) string {
	t := n.nsTopic + "/" + typ + "/" + n.cfg.NodeID
	if device != "" {
		t += "/" + device
	}
	return t
}

func nowMS() uint64 { return uint64(time.Now().UnixMilli()) }

// Run keeps a Sparkplug session up until ctx is done: each connection is
// a new session with the next bdSeq and its own NDEATH will. It returns
// after every goroutine it started (the DCMD write worker) has exited.
func (n *Node) Run(ctx context.Context) error {
	n.start = time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); n.writeLoop(ctx) }()
	defer wg.Wait()
	bo := backoff.Delay{Min: n.cfg.ReconnectMin, Max: n.cfg.ReconnectMax}
	for {
		began := time.Now()
		err := n.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errHostOffline) {
			bo.Reset()
			continue // reconnect at once and wait for the host
		}
		if time.Since(began) > n.cfg.ReconnectMax {
			bo.Reset()
		}
		wait := bo.Next()
		n.log.Warn("sparkplug: session ended; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

var errHostOffline = errors.New("sparkplug: primary host offline")

// Stats of the node for tests and logs.
func (n *Node) Refused() uint64 { return n.refused.Load() }
