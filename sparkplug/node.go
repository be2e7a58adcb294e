package sparkplug

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/backoff"
	"edgegw/internal/tlsfile"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
	"edgegw/tagtype"
)

// Writer carries out a DCMD write (declared here, implemented in main over
// the edge scheduler's write path: bus goroutine, type and range checks,
// read-back).
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// Tag describes one tag for its DBIRTH metric.
type Tag struct {
	Name     string
	Type     tagtype.Type
	Scaled   bool // scale != 1 or offset != 0: the value is not the raw integer
	Unit     string
	Min, Max *float64
	Writable bool
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

	Queue    *spool.Queue               // required: this node's own queue, fed with every appended batch
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

type writeCmd struct {
	t     *tagInfo
	value float64
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
			if datatypeOf(t) == TypeUnknown || t.Type.Kind() == tagtype.Text {
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

// datatypeOf is the tag's Sparkplug datatype (tagtype's): a scaled
// integer becomes Float (16-bit) or Double (wider), its value has decimals.
func datatypeOf(t Tag) uint32 { return t.Type.Sparkplug(t.Scaled) }

// valueOf encodes v as datatype dt.
func valueOf(dt uint32, v float64) Value {
	switch dt {
	case TypeBoolean:
		return Value{Kind: KindBool, B: v != 0}
	case TypeInt8, TypeInt16, TypeInt32:
		return Value{Kind: KindInt, U: uint64(uint32(int32(v)))}
	case TypeUInt8, TypeUInt16:
		return Value{Kind: KindInt, U: uint64(uint32(v))}
	case TypeInt64:
		return Value{Kind: KindLong, U: uint64(int64(v))}
	case TypeUInt32, TypeUInt64:
		return Value{Kind: KindLong, U: uint64(v)}
	case TypeFloat:
		return Value{Kind: KindFloat, F32: float32(v)}
	default:
		return Value{Kind: KindDouble, F64: v}
	}
}

// numberOf reads a command's value as a number for a tag of datatype dt.
func numberOf(dt uint32, v Value) (float64, error) {
	switch v.Kind {
	case KindBool:
		if v.B {
			return 1, nil
		}
		return 0, nil
	case KindInt:
		switch dt {
		case TypeInt8, TypeInt16, TypeInt32, TypeInt64:
			return float64(int32(uint32(v.U))), nil
		}
		return float64(uint32(v.U)), nil
	case KindLong:
		if dt == TypeInt64 || dt == TypeInt32 || dt == TypeInt16 || dt == TypeInt8 {
			return float64(int64(v.U)), nil
		}
		return float64(v.U), nil
	case KindFloat:
		return float64(v.F32), nil
	case KindDouble:
		return v.F64, nil
	}
	return 0, errors.New("no numeric or boolean value")
}

func qualityCode(q ringstore.Quality) int32 {
	switch q {
	case ringstore.Good:
		return QualityGood
	case ringstore.Timeout:
		return QualityCommFailure
	case ringstore.Stale:
		return QualityUncertain
	}
	return QualityBad
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

// events from paho's goroutines to the session loop.
type events struct {
	lost    chan struct{} // closed on connection loss
	lostErr error
	once    sync.Once
	rebirth chan struct{} // cap 1
	state   chan struct{} // cap 1: hostOnline changed
	mu      sync.Mutex
	online  bool
	stateTS uint64
}

func (e *events) kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// session is one MQTT connection: connect with the will, subscribe,
// (wait for the primary host,) births, then the data loop.
func (n *Node) session(ctx context.Context) error {
	bdSeq := n.bd.next()
	ev := &events{lost: make(chan struct{}), rebirth: make(chan struct{}, 1), state: make(chan struct{}, 1)}
	will := AppendPayload(nil, &Payload{Timestamp: nowMS(), HasTimestamp: true,
		Metrics: []Metric{{Name: MetricBdSeq, HasName: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: bdSeq}}}})
	o := mqtt.NewClientOptions().
		AddBroker(n.cfg.Broker).
		SetClientID(n.cfg.ClientID).
		SetUsername(n.cfg.Username).
		SetPassword(n.cfg.Password).
		SetCleanSession(true).
		SetStore(mqtt.NewOrderedMemoryStore()).
		SetOrderMatters(false).
		SetWriteTimeout(10*time.Second).
		SetConnectTimeout(10*time.Second).
		SetKeepAlive(30*time.Second).
		// One connection per session: a reconnect must carry a new bdSeq
		// in a new will, which paho's own reconnect cannot do.
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetBinaryWill(n.Topic("NDEATH", ""), will, 1, false)
	if n.tlsConf != nil {
		o.SetTLSConfig(n.tlsConf)
	}
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		ev.once.Do(func() { ev.lostErr = err; close(ev.lost) })
	})
	c := mqtt.NewClient(o)
	tok := c.Connect()
	if !waitToken(ctx, tok, 15*time.Second) {
		c.Disconnect(0)
		return fmt.Errorf("sparkplug: connect %s: %w", n.cfg.Broker, orTimeout(tok.Error()))
	}
	defer c.Disconnect(250)
	log := n.log.With("bdSeq", bdSeq)
	// Subscribed before any birth (the spec's order): with auto-reconnect
	// off there is one connect per client, so this is the OnConnect point.
	subs := map[string]byte{
		n.Topic("NCMD", ""):  1,
		n.Topic("DCMD", "+"): 1,
	}
	if h := n.cfg.PrimaryHostID; h != "" {
		subs["spBv1.0/STATE/"+h] = 1
	}
	st := c.SubscribeMultiple(subs, func(_ mqtt.Client, m mqtt.Message) { n.onMessage(ev, m) })
	if !waitToken(ctx, st, 10*time.Second) {
		return fmt.Errorf("sparkplug: subscribe: %w", orTimeout(st.Error()))
	}
	log.Info("sparkplug: connected", "broker", n.cfg.Broker, "node", n.Topic("NBIRTH", ""))
	s := &sess{n: n, c: c, ev: ev, bdSeq: bdSeq, log: log, last: map[uint64]lastVal{}, dead: map[string]bool{}, health: map[string]*stats.Device{}}
	return s.run(ctx)
}

func orTimeout(err error) error {
	if err == nil {
		return errors.New("timed out")
	}
	return err
}

// waitToken waits for tok, ctx or limit; true when tok completed without error.
func waitToken(ctx context.Context, tok mqtt.Token, limit time.Duration) bool {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error() == nil
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

// onMessage runs on paho's goroutine: it decodes and hands over, never blocks.
func (n *Node) onMessage(ev *events, m mqtt.Message) {
	topic := m.Topic()
	if strings.HasPrefix(topic, "spBv1.0/STATE/") {
		online, ts, ok := parseState(m.Payload())
		if !ok {
			n.log.Warn("sparkplug: unreadable STATE ignored", "topic", topic, "payload", fmt.Sprintf("%.100q", m.Payload()))
			return
		}
		ev.mu.Lock()
		if ts != 0 && ts < ev.stateTS {
			ev.mu.Unlock()
			return // an older STATE (the spec: ignore it)
		}
		ev.online, ev.stateTS = online, ts
		ev.mu.Unlock()
		ev.kick(ev.state)
		return
	}
	if m.Retained() {
		// A retained command would be carried out again at every connect.
		n.refuse("sparkplug: retained command ignored; clear it with an empty retained message", "topic", topic)
		return
	}
	p, err := DecodePayload(m.Payload())
	if err != nil {
		n.refuse("sparkplug: undecodable command refused", "topic", topic, "err", err)
		return
	}
	if topic == n.Topic("NCMD", "") {
		for _, mt := range p.Metrics {
			if (mt.HasName && mt.Name == MetricRebirth || mt.HasAlias && mt.Alias == aliasRebirth) && mt.Value.Kind == KindBool && mt.Value.B {
				n.log.Info("sparkplug: rebirth requested")
				ev.kick(ev.rebirth)
				continue
			}
			n.refuse("sparkplug: NCMD metric not supported", "name", mt.Name, "alias", mt.Alias)
		}
		return
	}
	device, ok := strings.CutPrefix(topic, n.Topic("DCMD", "")+"/")
	if !ok {
		return
	}
	for _, mt := range p.Metrics {
		var t *tagInfo
		if mt.HasName {
			t = n.tags[aliasKey{device, mt.Name}]
		} else if mt.HasAlias {
			t = n.byAlias[mt.Alias]
		}
		if t == nil || t.device != device {
			n.refuse("sparkplug: DCMD for an unknown metric refused", "device", device, "name", mt.Name, "alias", mt.Alias)
			continue
		}
		v, err := numberOf(t.datatype, mt.Value)
		switch {
		case err != nil || mt.IsNull:
			n.refuse("sparkplug: DCMD without a value refused", "device", device, "tag", t.Name)
			continue
		case !n.cfg.Writes || n.cfg.Writer == nil:
			n.refuse("sparkplug: DCMD refused: writes are off ([upstream.sparkplug] writes = false)", "device", device, "tag", t.Name, "value", v)
			continue
		}
		select {
		case n.writes <- writeCmd{t: t, value: v}:
		default:
			n.refuse("sparkplug: DCMD refused: write queue full", "device", device, "tag", t.Name)
		}
	}
}

// refuse counts a refused command and logs it, at most once per 10 s
// (with the number refused meanwhile): a publisher cannot flood the log.
func (n *Node) refuse(msg string, args ...any) {
	total := n.refused.Add(1)
	n.refuseLog.Log(n.log, "refused", msg, append(args, "refused_total", total)...)
}

// parseState reads a STATE payload: Sparkplug 3.0 JSON
// {"online":true,"timestamp":…}, or the 2.2 strings ONLINE / OFFLINE.
func parseState(b []byte) (online bool, ts uint64, ok bool) {
	s := strings.TrimSpace(string(b))
	switch strings.ToUpper(s) {
	case "ONLINE":
		return true, 0, true
	case "OFFLINE":
		return false, 0, true
	}
	var st struct {
		Online    *bool  `json:"online"`
		Timestamp uint64 `json:"timestamp"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Online == nil {
		return false, 0, false
	}
	return *st.Online, st.Timestamp, true
}

// writeLoop carries out DCMD writes one at a time through the Writer; the
// result shows in the next DDATA (the device is read back and polled).
func (n *Node) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-n.writes:
			wctx, cancel := context.WithTimeout(ctx, n.cfg.WriteTimeout)
			written, back, err := n.cfg.Writer.Write(wctx, w.t.device, w.t.Name, w.value, "sparkplug DCMD "+n.cfg.Broker)
			cancel()
			if err != nil {
				n.refused.Add(1)
				n.log.Warn("sparkplug: DCMD write failed", "device", w.t.device, "tag", w.t.Name, "value", w.value, "err", err)
				continue
			}
			n.log.Info("sparkplug: DCMD written", "device", w.t.device, "tag", w.t.Name, "written", written, "read_back", back)
		}
	}
}

type lastVal struct {
	v float64
	q ringstore.Quality
}

type pub struct {
	tok  mqtt.Token
	last uint64 // queue seq acknowledged when tok completes (0 = none)
}

// sess is the state of one session, owned by its loop.
type sess struct {
	n        *Node
	c        mqtt.Client
	ev       *events
	bdSeq    uint64
	log      *slog.Logger
	seq      uint64 // of the next message
	liveMark uint64 // queue samples up to here are historical
	last     map[uint64]lastVal
	dead     map[string]bool
	health   map[string]*stats.Device
	inflight []pub
	nodeLast map[uint64]Value
}

func (s *sess) nextSeq() uint64 {
	q := s.seq
	s.seq = (s.seq + 1) % 256
	return q
}

func (s *sess) publish(topic string, p *Payload, last uint64) {
	p.Timestamp, p.HasTimestamp = nowMS(), true
	p.Seq, p.HasSeq = s.nextSeq(), true
	// paho keeps the slice until written: a fresh one each time.
	tok := s.c.Publish(topic, 0, false, AppendPayload(nil, p))
	s.inflight = append(s.inflight, pub{tok: tok, last: last})
}

func (s *sess) hostOnline() bool {
	if s.n.cfg.PrimaryHostID == "" {
		return true
	}
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	return s.ev.online
}

func (s *sess) run(ctx context.Context) error {
	n := s.n
	// Wait for the primary host before any birth.
	for !s.hostOnline() {
		s.log.Info("sparkplug: waiting for the primary host", "host", n.cfg.PrimaryHostID)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		case <-s.ev.state:
		}
	}
	snap := s.firstValues(ctx)
	s.liveMark = snap.Seq
	s.births(snap, true)
	s.refreshHealth()
	after := n.cfg.Queue.Acked()
	check := time.NewTicker(n.cfg.CheckEvery)
	defer check.Stop()
	nodeData := time.NewTicker(n.cfg.NodeDataEvery)
	defer nodeData.Stop()
	var buf []ringstore.Sample
	for {
		// Settle written messages in order: the queue is acknowledged up
		// to the last sample of each.
		for len(s.inflight) > 0 && isDone(s.inflight[0].tok) {
			f := s.inflight[0]
			if err := f.tok.Error(); err != nil {
				return fmt.Errorf("sparkplug: publish: %w", err)
			}
			if f.last != 0 {
				n.cfg.Queue.Ack(f.last)
			}
			s.inflight = s.inflight[1:]
		}
		select { // a long replay still hears a stop or a lost link
		case <-ctx.Done():
			s.sayDeath()
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		default:
		}
		wake := n.cfg.Queue.Wait()
		if len(s.inflight) < n.cfg.MaxInFlight {
			buf = n.cfg.Queue.PeekAfter(after, 500, buf[:0])
			if len(buf) > 0 {
				after = s.data(buf)
				continue
			}
		}
		var done <-chan struct{}
		if len(s.inflight) > 0 {
			done = s.inflight[0].tok.Done()
			wake = nil
		}
		select {
		case <-ctx.Done():
			s.sayDeath()
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		case <-s.ev.state:
			if !s.hostOnline() {
				s.log.Warn("sparkplug: primary host offline: NDEATH, disconnect, store until it is back", "host", n.cfg.PrimaryHostID)
				t := s.c.Publish(n.Topic("NDEATH", ""), 1, false, s.death())
				waitToken(ctx, t, 5*time.Second)
				// Acknowledge, in order, what paho wrote before the NDEATH.
				for _, f := range s.inflight {
					if !isDone(f.tok) || f.tok.Error() != nil {
						break
					}
					if f.last != 0 {
						n.cfg.Queue.Ack(f.last)
					}
				}
				return errHostOffline
			}
		case <-s.ev.rebirth:
			s.births(n.cfg.Latest(), false)
		case <-check.C:
			if after >= s.liveMark {
				// Not while replaying: a DDEATH would precede the
				// historical DDATA of the device it declares dead.
				s.checkDevices()
			}
		case <-nodeData.C:
			s.nodeData()
		case <-wake:
		case <-done:
		}
	}
}

// sayDeath publishes NDEATH when the node stops: a clean disconnect sends
// no will.
func (s *sess) sayDeath() {
	waitToken(context.Background(), s.c.Publish(s.n.Topic("NDEATH", ""), 1, false, s.death()), time.Second)
}

// death is the NDEATH payload of the session (the will's, with a fresh timestamp).
func (s *sess) death() []byte {
	return AppendPayload(nil, &Payload{Timestamp: nowMS(), HasTimestamp: true,
		Metrics: []Metric{{Name: MetricBdSeq, HasName: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: s.bdSeq}}}})
}

func isDone(t mqtt.Token) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}

// firstValues returns the latest values once every tag has one, or after
// two intervals of the slowest device (at most 5 s), so that the first
// DBIRTHs carry values rather than nulls.
func (s *sess) firstValues(ctx context.Context) *ringstore.Snapshot {
	var limit time.Duration
	want := 0
	for _, d := range s.n.devs {
		limit = max(limit, 2*d.Interval)
		want += len(d.tags)
	}
	deadline := time.NewTimer(min(limit, 5*time.Second))
	defer deadline.Stop()
	for {
		wake := s.n.cfg.Queue.Wait()
		snap := s.n.cfg.Latest()
		have := 0
		for i := range snap.Latest {
			if s.n.tags[aliasKey{snap.Latest[i].Device, snap.Latest[i].Tag}] != nil {
				have++
			}
		}
		if have >= want {
			return snap
		}
		select {
		case <-ctx.Done():
			return snap
		case <-deadline.C:
			return snap
		case <-wake:
		}
	}
}

// nodeMetrics are the NBIRTH metrics after bdSeq and Rebirth.
func (s *sess) nodeMetrics() []Metric {
	n := s.n
	up := stats.UpstreamSnapshot{Path: stats.PathOff}
	if n.cfg.Upstream != nil {
		up = n.cfg.Upstream.Snapshot()
	}
	backlog := n.cfg.Queue.Stats()
	str := func(name string, alias uint64, v string) Metric {
		return Metric{Name: name, HasName: true, Alias: alias, HasAlias: true, Datatype: TypeString, Value: Value{Kind: KindString, S: v}}
	}
	u64 := func(name string, alias uint64, v uint64) Metric {
		return Metric{Name: name, HasName: true, Alias: alias, HasAlias: true, Datatype: TypeUInt64, Value: Value{Kind: KindLong, U: v}}
	}
	return []Metric{
		str(MetricVersion, aliasVersion, n.cfg.Version),
		u64(MetricUptime, aliasUptime, uint64(time.Since(n.start)/time.Second)),
		str(MetricUpstream, aliasUpstream, up.Path),
		u64(MetricQueueDepth, aliasQueueDepth, uint64(max(up.QueueSamples, 0))),
		u64(MetricBacklog, aliasBacklog, uint64(max(backlog.Samples, 0))),
		u64(MetricCmdsRefused, aliasCmdsRefused, n.refused.Load()),
		{Name: MetricWritesOn, HasName: true, Alias: aliasWritesEnabled, HasAlias: true, Datatype: TypeBoolean, Value: Value{Kind: KindBool, B: n.cfg.Writes && n.cfg.Writer != nil}},
	}
}

// births publishes NBIRTH (seq 0) and a DBIRTH per device with the
// current values. At the start of a session every device is born (the
// replay may hold its samples); a rebirth leaves dead devices dead.
func (s *sess) births(snap *ringstore.Snapshot, all bool) {
	n := s.n
	s.seq = 0
	ts := nowMS()
	ms := []Metric{
		{Name: MetricBdSeq, HasName: true, Timestamp: ts, HasTimestamp: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: s.bdSeq}},
		{Name: MetricRebirth, HasName: true, Alias: aliasRebirth, HasAlias: true, Timestamp: ts, HasTimestamp: true, Datatype: TypeBoolean, Value: Value{Kind: KindBool}},
	}
	nm := s.nodeMetrics()
	s.nodeLast = map[uint64]Value{}
	for i := range nm {
		nm[i].Timestamp, nm[i].HasTimestamp = ts, true
		s.nodeLast[nm[i].Alias] = nm[i].Value
	}
	s.publish(n.Topic("NBIRTH", ""), &Payload{Metrics: append(ms, nm...)}, 0)
	latest := map[aliasKey]*ringstore.Sample{}
	for i := range snap.Latest {
		x := &snap.Latest[i]
		latest[aliasKey{x.Device, x.Tag}] = x
	}
	if all {
		clear(s.dead)
	}
	for i := range n.devs {
		if !s.dead[n.devs[i].Name] {
			s.dbirth(&n.devs[i], latest)
		}
	}
	s.log.Info("sparkplug: births published", "devices", len(n.devs))
}

func (s *sess) dbirth(d *devInfo, latest map[aliasKey]*ringstore.Sample) {
	ms := make([]Metric, 0, len(d.tags))
	now := nowMS()
	for _, t := range d.tags {
		m := Metric{Name: t.Name, HasName: true, Alias: t.alias, HasAlias: true, Timestamp: now, HasTimestamp: true, Datatype: t.datatype}
		q, code := ringstore.Error, int32(QualityBad) // not read yet
		if x := latest[aliasKey{d.Name, t.Name}]; x != nil {
			q, code = x.Quality, qualityCode(x.Quality)
			m.Timestamp = uint64(x.TS / 1000)
			if q == ringstore.Good {
				m.Value = valueOf(t.datatype, x.Value)
			}
			s.last[t.alias] = lastVal{v: x.Value, q: q}
		} else {
			delete(s.last, t.alias)
		}
		m.IsNull = q != ringstore.Good
		if t.Unit != "" {
			m.Props = append(m.Props, Property{Key: "engUnit", Type: TypeString, Value: Value{Kind: KindString, S: t.Unit}})
		}
		if t.Min != nil {
			m.Props = append(m.Props, Property{Key: "engLow", Type: TypeDouble, Value: Value{Kind: KindDouble, F64: *t.Min}})
		}
		if t.Max != nil {
			m.Props = append(m.Props, Property{Key: "engHigh", Type: TypeDouble, Value: Value{Kind: KindDouble, F64: *t.Max}})
		}
		m.Props = append(m.Props,
			Property{Key: "Quality", Type: TypeInt32, Value: Value{Kind: KindInt, U: uint64(uint32(code))}},
			Property{Key: "writable", Type: TypeBoolean, Value: Value{Kind: KindBool, B: t.Writable}})
		ms = append(ms, m)
	}
	s.publish(s.n.Topic("DBIRTH", d.Name), &Payload{Metrics: ms}, 0)
}

// data publishes the samples (queue order) as DDATA, one message per poll
// of one device, and returns the last seq handled. Historical samples
// (seq <= liveMark: stored while no host or no broker was there) are all
// sent, flagged is_historical; live ones only when value or quality
// changed. A timeout or error is is_null with a Quality property.
func (s *sess) data(buf []ringstore.Sample) uint64 {
	n := s.n
	var last uint64
	for i := 0; i < len(buf); {
		j := i + 1
		for j < len(buf) && buf[j].Device == buf[i].Device && buf[j].TS == buf[i].TS {
			j++
		}
		poll := buf[i:j]
		last = poll[len(poll)-1].Seq
		i = j
		di, ok := n.byName[poll[0].Device]
		if !ok {
			n.unknown.Add(uint64(len(poll)))
			s.ackOnly(last)
			continue
		}
		d := &n.devs[di]
		historical := last <= s.liveMark
		if !historical && s.dead[d.Name] {
			if !s.alive(d) {
				s.ackOnly(last) // still dead: its samples are nulls, the DDEATH said it
				continue
			}
			s.rebirthDevice(d)
		}
		var ms []Metric
		for k := range poll {
			x := &poll[k]
			t := n.tags[aliasKey{x.Device, x.Tag}]
			if t == nil {
				n.unknown.Add(1)
				continue
			}
			prev, seen := s.last[t.alias]
			if !historical && seen && prev.q == x.Quality && (x.Quality != ringstore.Good || prev.v == x.Value) {
				continue
			}
			m := Metric{Alias: t.alias, HasAlias: true, Timestamp: uint64(x.TS / 1000), HasTimestamp: true,
				IsHistorical: historical, IsNull: x.Quality != ringstore.Good}
			if !m.IsNull {
				m.Value = valueOf(t.datatype, x.Value)
			}
			if !seen || prev.q != x.Quality {
				m.Props = []Property{{Key: "Quality", Type: TypeInt32, Value: Value{Kind: KindInt, U: uint64(uint32(qualityCode(x.Quality)))}}}
			}
			if !historical {
				s.last[t.alias] = lastVal{v: x.Value, q: x.Quality}
			}
			ms = append(ms, m)
		}
		if len(ms) == 0 {
			s.ackOnly(last) // nothing changed
			continue
		}
		s.publish(n.Topic("DDATA", d.Name), &Payload{Metrics: ms}, last)
	}
	return last
}

// ackOnly acknowledges samples that need no message, in order with the
// messages before them.
func (s *sess) ackOnly(last uint64) {
	s.inflight = append(s.inflight, pub{tok: doneToken{}, last: last})
}

func (s *sess) rebirthDevice(d *devInfo) {
	delete(s.dead, d.Name)
	latest := map[aliasKey]*ringstore.Sample{}
	snap := s.n.cfg.Latest()
	for i := range snap.Latest {
		if x := &snap.Latest[i]; x.Device == d.Name {
			latest[aliasKey{x.Device, x.Tag}] = x
		}
	}
	s.log.Info("sparkplug: device back: DBIRTH", "device", d.Name)
	s.dbirth(d, latest)
}

// alive reads the device's health record: dead once demoted (3 polls
// without an answer) or without a good poll for 3 intervals. The records
// are looked up by refreshHealth.
func (s *sess) alive(d *devInfo) bool {
	st := s.health[d.Name]
	if st == nil {
		return true
	}
	if st.Demoted.Load() {
		return false
	}
	iv := d.Interval
	if iv <= 0 {
		iv = time.Second
	}
	if st.Polls.Load() > 0 {
		lg := st.LastGoodUS.Load()
		if lg == 0 || time.Since(time.UnixMicro(lg)) > 3*iv {
			return false
		}
	}
	return true
}

// refreshHealth looks up the devices' health records (a reload may have
// replaced them).
func (s *sess) refreshHealth() {
	if s.n.cfg.Stats == nil {
		return
	}
	clear(s.health)
	for _, e := range s.n.cfg.Stats() {
		if _, ok := s.n.byName[e.Info.Name]; ok && e.Stats != nil {
			s.health[e.Info.Name] = e.Stats
		}
	}
}

// checkDevices publishes DDEATH for devices gone down and DBIRTH for
// devices back up.
func (s *sess) checkDevices() {
	s.refreshHealth()
	for i := range s.n.devs {
		d := &s.n.devs[i]
		alive := s.alive(d)
		switch {
		case !alive && !s.dead[d.Name]:
			s.dead[d.Name] = true
			s.log.Warn("sparkplug: device down: DDEATH", "device", d.Name)
			s.publish(s.n.Topic("DDEATH", d.Name), &Payload{}, 0)
		case alive && s.dead[d.Name]:
			s.rebirthDevice(d)
		}
	}
}

// nodeData publishes the gateway metrics that changed as NDATA.
func (s *sess) nodeData() {
	ts := nowMS()
	var ms []Metric
	for _, m := range s.nodeMetrics() {
		if prev, ok := s.nodeLast[m.Alias]; ok && sameValue(prev, m.Value) {
			continue
		}
		s.nodeLast[m.Alias] = m.Value
		ms = append(ms, Metric{Alias: m.Alias, HasAlias: true, Timestamp: ts, HasTimestamp: true, Value: m.Value})
	}
	if len(ms) > 0 {
		s.publish(s.n.Topic("NDATA", ""), &Payload{Metrics: ms}, 0)
	}
}

// doneToken is a completed token: a queue step that needed no message.
type doneToken struct{}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneToken) Wait() bool                     { return true }
func (doneToken) WaitTimeout(time.Duration) bool { return true }
func (doneToken) Done() <-chan struct{}          { return closedCh }
func (doneToken) Error() error                   { return nil }

var _ mqtt.Token = doneToken{}

// Stats of the node for tests and logs.
func (n *Node) Refused() uint64 { return n.refused.Load() }

func sameValue(a, b Value) bool {
	return a.Kind == b.Kind && a.U == b.U && a.S == b.S && a.B == b.B && a.F32 == b.F32 && a.F64 == b.F64
}
