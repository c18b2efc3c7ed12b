package bridge

// table maps uint64 keys to uint32 values with open addressing and linear
// probing: 12 bytes a slot, no pointers for the garbage collector to scan.
// Go's map spends 16 bytes a slot on this pair plus control bytes, and the
// bridge keeps two of these per engine block.
type table struct {
	keys  []uint64 // 0: empty slot
	vals  []uint32
	n     int
	shift uint
	// Key 0 cannot mark an empty slot and lives apart.
	hasZero bool
	zeroVal uint32
}

const minTableBits = 6

func (t *table) init(bits uint) {
	t.keys = make([]uint64, 1<<bits)
	t.vals = make([]uint32, 1<<bits)
	t.n, t.shift, t.hasZero, t.zeroVal = 0, 64-bits, false, 0
}

// home is the slot a key hashes to: Fibonacci hashing, as engine hashes in
// tests (and from some publishers) are small integers.
func (t *table) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> t.shift) }

func (t *table) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

func (t *table) get(k uint64) (uint32, bool) {
	if k == 0 {
		return t.zeroVal, t.hasZero
	}
	if t.keys == nil {
		return 0, false
	}
	mask := len(t.keys) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case k:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

func (t *table) put(k uint64, v uint32) {
	if k == 0 {
		t.hasZero, t.zeroVal = true, v
		return
	}
	if t.keys == nil {
		t.init(minTableBits)
	}
	if 4*(t.n+1) > 3*len(t.keys) {
		t.grow()
	}
	mask := len(t.keys) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case k:
			t.vals[i] = v
			return
		case 0:
			t.keys[i], t.vals[i] = k, v
			t.n++
			return
		}
	}
}

func (t *table) grow() {
	keys, vals := t.keys, t.vals
	hasZero, zeroVal := t.hasZero, t.zeroVal
	t.init(uint(64-t.shift) + 1)
	t.hasZero, t.zeroVal = hasZero, zeroVal
	mask := len(t.keys) - 1
	for j, k := range keys {
		if k == 0 {
			continue
		}
		i := t.home(k)
		for t.keys[i] != 0 {
			i = (i + 1) & mask
		}
		t.keys[i], t.vals[i] = k, vals[j]
		t.n++
	}
}

// del removes k, shifting back the entries after it that probed past its
// slot, so that no tombstones accumulate.
func (t *table) del(k uint64) {
	if k == 0 {
		t.hasZero, t.zeroVal = false, 0
		return
	}
	if t.keys == nil {
		return
	}
	mask := len(t.keys) - 1
	i := t.home(k)
	for t.keys[i] != k {
		if t.keys[i] == 0 {
			return
		}
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		if t.keys[j] == 0 {
			break
		}
		// The entry at j stays if its home lies cyclically in (i, j].
		h := t.home(t.keys[j])
		if i <= j && i < h && h <= j || i > j && (i < h || h <= j) {
			continue
		}
		t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
		i = j
	}
	t.keys[i], t.vals[i] = 0, 0
	t.n--
}

// bytes returns the memory the table holds.
func (t *table) bytes() int { return 12 * len(t.keys) }
