//go:build !race

package scrape

const raceEnabled = false
