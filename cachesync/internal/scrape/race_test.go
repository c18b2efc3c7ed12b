//go:build race

package scrape

// raceEnabled: the race detector slows every goroutine, the test's load
// generators included, several times over.
const raceEnabled = true
