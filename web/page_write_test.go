package web

import (
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/stats"
)

func boilerDevices() fakeDevices {
	d := &stats.Device{}
	d.Polls.Add(1)
	d.GoodPolls.Add(1)
	d.LastGoodUS.Store(time.Now().UnixMicro())
	return fakeDevices{{
		Info: stats.Info{Name: "boiler-plc", Transport: "tcp", Address: "127.0.0.1:1502", Unit: 1, Interval: time.Hour,
			Tags: []stats.TagInfo{{Name: "setpoint", Unit: "°C", Writable: true}, {Name: "temperature", Unit: "°C"}}},
		Stats: d,
	}}
}

// The device view's set-point control: only on writable tags, only while
// writes are on; the token is asked once per session; the read-back is
// shown; a wrong token is refused and forgotten.
func TestPageWritesSetPoint(t *testing.T) {
	testenv.Need(t, "chromium")
	w := &scriptWriter{}
	ts := startServer(t, Config{Devices: boilerDevices(), WriteToken: "tok-123", Writer: w})
	b := testenv.StartBrowser(t, ts.base+"/#device=boiler-plc", 1280, 900)
	b.WaitJS(20*time.Second, "the device view", `document.body.dataset.viewLoaded === 'boiler-plc@600'`, `document.body.dataset.viewLoaded`)
	b.WaitJS(10*time.Second, "the set-point control on the writable tag only",
		`document.querySelectorAll('form.set').length === 1 && !document.querySelector('form.set[data-writable=setpoint]').hidden`,
		`document.querySelectorAll('form.set').length`)
	write := func(v, token string) string {
		t.Helper()
		if err := b.Eval(`(() => { window.prompts = (window.prompts || 0); window.prompt = () => { window.prompts++; return '`+token+`'; };
			const f = document.querySelector('form.set'); f.querySelector('output').textContent = '';
			f.querySelector('input').value = '`+v+`'; f.querySelector('button').click(); })()`, nil); err != nil {
			t.Fatal(err)
		}
		b.WaitJS(10*time.Second, "the write's outcome", `/^(written|refused|failed)/.test(document.querySelector('form.set output').textContent)`,
			`document.querySelector('form.set output').textContent`)
		var out string
		if err := b.Eval(`document.querySelector('form.set output').textContent`, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := write("55.5", "tok-123"); !strings.Contains(out, "written 55.5, read back 55.5 °C") {
		t.Errorf("first write: %q", out)
	}
	if out := write("56", "not asked"); !strings.Contains(out, "read back 56 °C") {
		t.Errorf("second write: %q", out)
	}
	var prompts int
	if err := b.Eval(`window.prompts`, &prompts); err != nil || prompts != 1 {
		t.Errorf("the token was asked %d times in the session, want once (%v)", prompts, err)
	}
	if err := b.Eval(`sessionStorage.setItem('edgegw-write-token', 'wrong')`, nil); err != nil {
		t.Fatal(err)
	}
	if out := write("57", "x"); !strings.HasPrefix(out, "refused (401)") {
		t.Errorf("wrong token: %q", out)
	}
	var kept string
	if err := b.Eval(`sessionStorage.getItem('edgegw-write-token') || ''`, &kept); err != nil || kept != "" {
		t.Errorf("a refused token is kept: %q %v", kept, err)
	}
	if n := w.ncalls(); n != 2 || !strings.HasPrefix(w.calls[0], "boiler-plc/setpoint=55.5") {
		t.Errorf("writer calls: %v", w.calls)
	}

	// Writes off: no control.
	off := startServer(t, Config{Devices: boilerDevices()})
	b2 := testenv.StartBrowser(t, off.base+"/#device=boiler-plc", 1280, 900)
	b2.WaitJS(20*time.Second, "the device view", `document.body.dataset.viewLoaded === 'boiler-plc@600'`, `document.body.dataset.viewLoaded`)
	b2.WaitJS(10*time.Second, "the status read", `document.body.dataset.resumeWindowS !== undefined`, "")
	var visible int
	if err := b2.Eval(`[...document.querySelectorAll('form.set')].filter(f => !f.hidden).length`, &visible); err != nil || visible != 0 {
		t.Errorf("writes off: %d set-point controls shown (%v)", visible, err)
	}
}
