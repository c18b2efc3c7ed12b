package main

import (
	"slices"
	"testing"
)

func TestKibs(t *testing.T) {
	tests := []struct {
		list string
		want []int // nil: an error
	}{
		{"2,16", []int{2 << 10, 16 << 10}},
		{" 512 ", []int{512 << 10}},
		{"", nil},
		{"0", nil},
		{"-2", nil},
		{"2k", nil},
		{"65537", nil},
	}
	for _, tt := range tests {
		got, err := kibs(tt.list)
		if tt.want == nil {
			if err == nil {
				t.Errorf("kibs(%q) = %v, want an error", tt.list, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("kibs(%q) = %v, %v; want %v", tt.list, got, err, tt.want)
		}
	}
}
