// The tables' sort orders, which Dash AG Grid calls by name from the column definitions
// (dashboards/pages/findings.py), as AG Grid comparators (valueA, valueB, nodeA, nodeB,
// isDescending): empty cells last whichever way a column sorts, text without regard to case.
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});

function nsysanCompare(a, b, isDescending) {
    const emptyA = a === null || a === undefined || a === "";
    const emptyB = b === null || b === undefined || b === "";
    if (emptyA || emptyB) {
        // AG Grid reverses a comparator's answer for a descending sort: undo that for empty cells
        return emptyA === emptyB ? 0 : (emptyA ? 1 : -1) * (isDescending ? -1 : 1);
    }
    if (typeof a === "string" && typeof b === "string") {
        return a.localeCompare(b, undefined, { sensitivity: "base" });
    }
    return a < b ? -1 : a > b ? 1 : 0;
}

dagfuncs.nsysanOrder = function (valueA, valueB, nodeA, nodeB, isDescending) {
    return nsysanCompare(valueA, valueB, isDescending);
};

// severity by its rank (the rows carry it), not alphabetically
dagfuncs.nsysanSeverityOrder = function (valueA, valueB, nodeA, nodeB, isDescending) {
    return nsysanCompare(nodeA.data.severity_rank, nodeB.data.severity_rank, isDescending);
};

// a title cell holds a markdown link: sort by the title's text
dagfuncs.nsysanTitleOrder = function (valueA, valueB, nodeA, nodeB, isDescending) {
    return nsysanCompare(nodeA.data.plain_title, nodeB.data.plain_title, isDescending);
};
