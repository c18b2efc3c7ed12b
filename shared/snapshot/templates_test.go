package snapshot

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

var qwenLike = ChatTemplate{Model: "acme/chat-7b", Source: "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
	Special: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}}

func TestChatTemplatesShipOnceAndFollowChanges(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, 2)
	st := newStore()
	st.fetch(t, b.Build(epoch))
	v := NewView(st.keys)
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.ChatTemplate(qwenLike.Model); ok || v.TemplatesID() != 0 {
		t.Fatal("a snapshot without templates ships one")
	}

	other := ChatTemplate{Model: "acme/other", Source: "{{ messages[0].content }}"}
	if _, err := b.SetChatTemplates([]ChatTemplate{qwenLike, other}); err != nil {
		t.Fatal(err)
	}
	withTemplates := st.fetch(t, b.Build(epoch))
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	got, ok := v.ChatTemplate(qwenLike.Model)
	if !ok || got.Source != qwenLike.Source || !maps.Equal(got.Special, qwenLike.Special) {
		t.Fatalf("shipped template = %+v, %v", got, ok)
	}
	if got, ok := v.ChatTemplate(other.Model); !ok || got.Source != other.Source || len(got.Special) != 0 {
		t.Fatalf("second template = %+v, %v", got, ok)
	}
	if _, ok := v.ChatTemplate("acme/none"); ok {
		t.Error("a model with no template shipped has one")
	}
	id := v.TemplatesID()
	if id == 0 {
		t.Fatal("TemplatesID 0 with templates held")
	}

	// The same templates again, in another order: nothing new to copy.
	if changed, err := b.SetChatTemplates([]ChatTemplate{other, qwenLike}); err != nil || changed {
		t.Fatalf("the same templates reordered: changed %v, %v", changed, err)
	}
	unchanged := st.fetch(t, b.Build(epoch))
	if unchanged >= withTemplates-len(qwenLike.Source) {
		t.Errorf("a bundle with unchanged templates is %d bytes, the one that brought them %d: they were sent again", unchanged, withTemplates)
	}
	rs, err := v.Refresh(st.get)
	if err != nil {
		t.Fatal(err)
	}
	if v.TemplatesID() != id || rs.Bytes > unchanged {
		t.Errorf("refresh with unchanged templates: id %x -> %x, read %d bytes", id, v.TemplatesID(), rs.Bytes)
	}

	changed := qwenLike
	changed.Special = map[string]string{"bos_token": "<bos>"}
	if _, err := b.SetChatTemplates([]ChatTemplate{changed}); err != nil {
		t.Fatal(err)
	}
	st.fetch(t, b.Build(epoch))
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	if got, _ := v.ChatTemplate(qwenLike.Model); got.Special["bos_token"] != "<bos>" || v.TemplatesID() == id {
		t.Errorf("changed special tokens not picked up: %+v", got)
	}
	if _, ok := v.ChatTemplate(other.Model); ok {
		t.Error("a template removed is still shipped")
	}

	// A fetcher that joins now gets them in its full bundle.
	late := newStore()
	late.fetch(t, b.Build(epoch))
	lv := NewView(late.keys)
	if _, err := lv.Refresh(late.get); err != nil {
		t.Fatal(err)
	}
	if got, ok := lv.ChatTemplate(qwenLike.Model); !ok || got.Special["bos_token"] != "<bos>" {
		t.Errorf("full bundle's template = %+v, %v", got, ok)
	}

	if _, err := b.SetChatTemplates(nil); err != nil {
		t.Fatal(err)
	}
	st.fetch(t, b.Build(epoch))
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.ChatTemplate(qwenLike.Model); ok || v.TemplatesID() != 0 {
		t.Error("templates outlive their removal")
	}
}

func TestSetChatTemplatesRefuses(t *testing.T) {
	many := make([]ChatTemplate, MaxChatTemplates+1)
	for i := range many {
		many[i] = ChatTemplate{Model: "m" + strings.Repeat("x", i), Source: "x"}
	}
	for _, c := range []struct {
		name string
		ts   []ChatTemplate
	}{
		{"no model", []ChatTemplate{{Source: "x"}}},
		{"no source", []ChatTemplate{{Model: "m"}}},
		{"huge source", []ChatTemplate{{Model: "m", Source: strings.Repeat("x", MaxChatTemplateLen+1)}}},
		{"two for one model", []ChatTemplate{{Model: "m", Source: "a"}, {Model: "m", Source: "b"}}},
		{"long special token", []ChatTemplate{{Model: "m", Source: "a", Special: map[string]string{"bos_token": strings.Repeat("x", 256)}}}},
		{"too many", many},
	} {
		b := newBuilder(t, BuilderConfig{ShardBits: 1}, 1)
		if _, err := b.SetChatTemplates(c.ts); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

func TestCorruptTemplates(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, 1)
	if _, err := b.SetChatTemplates([]ChatTemplate{qwenLike}); err != nil {
		t.Fatal(err)
	}
	im := b.Build(epoch)
	good := im.templates
	if _, err := parseTemplates(good); err != nil {
		t.Fatal(err)
	}
	body := headerSize + 8
	for _, c := range []struct {
		name string
		edit func([]byte) []byte
	}{
		{"count past the entries", func(p []byte) []byte { le.PutUint32(p[24:], 2); return p }},
		{"count above the bound", func(p []byte) []byte { le.PutUint32(p[24:], MaxChatTemplates+1); return p }},
		{"model length past the end", func(p []byte) []byte { le.PutUint32(p[body:], 1<<30); return p }},
		{"empty model", func(p []byte) []byte {
			n := int(le.Uint32(p[body:]))
			le.PutUint32(p[body:], 0)
			return append(p[:body+4], p[body+4+n:]...)
		}},
		{"reserved bytes", func(p []byte) []byte { p[28] = 1; return p }},
		{"trailing bytes", func(p []byte) []byte {
			return append(p[:len(p)-trailerSize], 0, 0, 0, 0, 0, 0, 0, 0, 0)
		}},
	} {
		p := append([]byte(nil), good...)
		p = c.edit(p)
		le.PutUint32(p[16:], uint32(len(p)))
		if _, err := parseTemplates(reseal(p)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err %v, want ErrCorrupt", c.name, err)
		}
	}
	flipped := append([]byte(nil), good...)
	flipped[body+6] ^= 1
	if _, err := parseTemplates(flipped); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a flipped byte: err %v", err)
	}

	// A bundle whose templates are not the manifest's is refused whole.
	other := newBuilder(t, BuilderConfig{ShardBits: 1}, 1)
	if _, err := other.SetChatTemplates([]ChatTemplate{{Model: "x", Source: "y"}}); err != nil {
		t.Fatal(err)
	}
	swapped := *im
	swapped.templates = other.Build(epoch).templates
	if _, err := ParseBundle(swapped.AppendBundle(nil, 0)); !errors.Is(err, ErrInconsistent) {
		t.Errorf("bundle with another snapshot's templates: err %v", err)
	}
	missing := *im
	missing.templates = nil
	if _, err := ParseBundle(missing.AppendBundle(nil, 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bundle without the templates its manifest lists: err %v", err)
	}
}
