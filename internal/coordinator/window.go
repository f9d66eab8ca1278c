package coordinator

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // a machine's root image carries no zoneinfo

	"liken.dev/liken/api/v1alpha1"
)

// Windows says whether a maintenance window is open at now and, when none is, when the
// next opens. No window at all means always open.
func Windows(ws []v1alpha1.MaintenanceWindow, now time.Time) (open bool, next time.Time, err error) {
	if len(ws) == 0 {
		return true, time.Time{}, nil
	}
	for i, w := range ws {
		loc := time.UTC
		if w.TimeZone != "" {
			if loc, err = time.LoadLocation(w.TimeZone); err != nil {
				return false, time.Time{}, fmt.Errorf("maintenanceWindows[%d]: unknown time zone %q", i, w.TimeZone)
			}
		}
		h, m, ok := strings.Cut(w.Start, ":")
		hh, err1 := strconv.Atoi(h)
		mm, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || hh > 23 || mm > 59 || w.Duration.Duration <= 0 {
			return false, time.Time{}, fmt.Errorf("maintenanceWindows[%d]: start %q or duration %s is not valid", i, w.Start, w.Duration.Duration)
		}
		days := map[time.Weekday]bool{}
		for _, d := range w.Days {
			for wd := time.Sunday; wd <= time.Saturday; wd++ {
				if wd.String() == string(d) {
					days[wd] = true
				}
			}
		}
		local := now.In(loc)
		// A window may have opened up to a week ago (durations reach 168h) and the next
		// opening is within a week.
		for off := -7; off <= 7; off++ {
			d := local.AddDate(0, 0, off)
			start := time.Date(d.Year(), d.Month(), d.Day(), hh, mm, 0, 0, loc)
			if len(days) > 0 && !days[start.Weekday()] {
				continue
			}
			if !now.Before(start) && now.Before(start.Add(w.Duration.Duration)) {
				return true, time.Time{}, nil
			}
			if start.After(now) && (next.IsZero() || start.Before(next)) {
				next = start
			}
		}
	}
	return false, next, nil
}
