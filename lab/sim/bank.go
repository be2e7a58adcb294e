package sim

// Sparse storage: 65536 addresses per table, kept in pages allocated on the
// first non-zero write. An untouched logger costs four nil maps; the model
// registers are computed, not stored.

const pageShift = 8 // 256 addresses per page

type words map[uint16]*[1 << pageShift]uint16

func (w *words) get(a uint16) uint16 {
	if p := (*w)[a>>pageShift]; p != nil {
		return p[a&(1<<pageShift-1)]
	}
	return 0
}

func (w *words) set(a, v uint16) {
	p := (*w)[a>>pageShift]
	if p == nil {
		if v == 0 {
			return
		}
		if *w == nil {
			*w = make(words)
		}
		p = new([1 << pageShift]uint16)
		(*w)[a>>pageShift] = p
	}
	p[a&(1<<pageShift-1)] = v
}

type bits map[uint16]*[1 << pageShift / 64]uint64

func (b *bits) get(a uint16) bool {
	if p := (*b)[a>>pageShift]; p != nil {
		i := a & (1<<pageShift - 1)
		return p[i/64]&(1<<(i%64)) != 0
	}
	return false
}

func (b *bits) set(a uint16, v bool) {
	p := (*b)[a>>pageShift]
	if p == nil {
		if !v {
			return
		}
		if *b == nil {
			*b = make(bits)
		}
		p = new([1 << pageShift / 64]uint64)
		(*b)[a>>pageShift] = p
	}
	i := a & (1<<pageShift - 1)
	if v {
		p[i/64] |= 1 << (i % 64)
	} else {
		p[i/64] &^= 1 << (i % 64)
	}
}
