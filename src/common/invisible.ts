/**
 * Characters no reader sees, or that change how the characters around them are shown: Unicode's
 * format characters (`\p{Cf}`: bidi overrides and isolates such as U+202E, zero-width spaces and
 * joiners, U+FEFF) and the other default-ignorable code points (Hangul fillers U+115F and U+3164,
 * variation selectors, U+034F), and U+2800, the Braille pattern blank, which is a symbol to
 * Unicode but shows as a space, as a regular-expression class body (`u` flag). Identifiers refuse
 * them (validation.ts); the console shows them, and more, as marked code points. This file
 * imports nothing: the console imports it too. (U+2800 is in the pattern as itself: the OpenAPI
 * document carries it, and RE2-based tools take no `\u` escape.)
 */
export const INVISIBLE_CLASS = '\\p{Cf}\\p{Default_Ignorable_Code_Point}\u2800';
