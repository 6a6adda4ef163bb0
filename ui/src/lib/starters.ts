// First-run starters for a base model (one without a chat template, such as the offline
// Gemma 3 270M): prompts it can do something with, each showing what the app is for. One
// continues a long document, so the KV cache grows on the timeline; the other switches the
// cache precision mid-answer, so the timeline marks the switch while the answer streams.

import type { CacheOptions, ModelCard } from "./api";
import type { IconName } from "./icons";

/** A cache the engine's options name: its default, or the TurboQuant cache it suggests. */
export type CacheRole = keyof Pick<CacheOptions, "default_spec" | "suggested_spec">;

export interface Starter {
  id: string;
  icon: IconName;
  title: string;
  description: string;
  /** The text the model continues. */
  prompt: string;
  /** Shown as an attachment chip instead of the prompt's text, when set. */
  document?: string;
  /** The cache to start the answer in, when set: one the engine names in its cache options. */
  from?: CacheRole;
  /** The cache to switch to mid-answer, when set (as `from`). */
  switchTo?: CacheRole;
  /** Answer tokens to wait for before switching. */
  switchAfter?: number;
}

/** Whether `card` is a base model: its checkpoint ships no chat template. */
export function isBaseModel(card: Pick<ModelCard, "has_chat_template"> | null | undefined): boolean {
  return card?.has_chat_template === false;
}

/**
 * The opening of Alice's Adventures in Wonderland (Lewis Carroll, 1865; public domain), from
 * the Canterbury corpus copy the tests use (the `alice` asset, alice29.txt): chapter I up to
 * the end of the fall, its hard line breaks joined and its `quotes' made plain.
 */
export const ALICE_OPENING = `CHAPTER I. Down the Rabbit-Hole

Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations in it, 'and what is the use of a book,' thought Alice 'without pictures or conversation?'

So she was considering in her own mind (as well as she could, for the hot day made her feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink eyes ran close by her.

There was nothing so VERY remarkable in that; nor did Alice think it so VERY much out of the way to hear the Rabbit say to itself, 'Oh dear! Oh dear! I shall be late!' (when she thought it over afterwards, it occurred to her that she ought to have wondered at this, but at the time it all seemed quite natural); but when the Rabbit actually TOOK A WATCH OUT OF ITS WAISTCOAT- POCKET, and looked at it, and then hurried on, Alice started to her feet, for it flashed across her mind that she had never before seen a rabbit with either a waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran across the field after it, and fortunately was just in time to see it pop down a large rabbit-hole under the hedge.

In another moment down went Alice after it, never once considering how in the world she was to get out again.

The rabbit-hole went straight on like a tunnel for some way, and then dipped suddenly down, so suddenly that Alice had not a moment to think about stopping herself before she found herself falling down a very deep well.

Either the well was very deep, or she fell very slowly, for she had plenty of time as she went down to look about her and to wonder what was going to happen next. First, she tried to look down and make out what she was coming to, but it was too dark to see anything; then she looked at the sides of the well, and noticed that they were filled with cupboards and book-shelves; here and there she saw maps and pictures hung upon pegs. She took down a jar from one of the shelves as she passed; it was labelled 'ORANGE MARMALADE', but to her great disappointment it was empty: she did not like to drop the jar for fear of killing somebody, so managed to put it into one of the cupboards as she fell past it.

'Well!' thought Alice to herself, 'after such a fall as this, I shall think nothing of tumbling down stairs! How brave they'll all think me at home! Why, I wouldn't say anything about it, even if I fell off the top of the house!' (Which was very likely true.)

Down, down, down. Would the fall NEVER come to an end! 'I wonder how many miles I've fallen by this time?' she said aloud. 'I must be getting somewhere near the centre of the earth. Let me see: that would be four thousand miles down, I think--' (for, you see, Alice had learnt several things of this sort in her lessons in the schoolroom, and though this was not a VERY good opportunity for showing off her knowledge, as there was no one to listen to her, still it was good practice to say it over) '--yes, that's about the right distance--but then I wonder what Latitude or Longitude I've got to?' (Alice had no idea what Latitude was, or Longitude either, but thought they were nice grand words to say.)

Presently she began again. 'I wonder if I shall fall right THROUGH the earth! How funny it'll seem to come out among the people that walk with their heads downward! The Antipathies, I think--' (she was rather glad there WAS no one listening, this time, as it didn't sound at all the right word) '--but I shall have to ask them what the name of the country is, you know. Please, Ma'am, is this New Zealand or Australia?' (and she tried to curtsey as she spoke--fancy CURTSEYING as you're falling through the air! Do you think you could manage it?) 'And what an ignorant little girl she'll think me for asking! No, it'll never do to ask: perhaps I shall see it written up somewhere.'

Down, down, down. There was nothing else to do, so Alice soon began talking again. 'Dinah'll miss me very much to-night, I should think!' (Dinah was the cat.) 'I hope they'll remember her saucer of milk at tea-time. Dinah my dear! I wish you were down here with me! There are no mice in the air, I'm afraid, but you might catch a bat, and that's very like a mouse, you know. But do cats eat bats, I wonder?' And here Alice began to get rather sleepy, and went on saying to herself, in a dreamy sort of way, 'Do cats eat bats? Do cats eat bats?' and sometimes, 'Do bats eat cats?' for, you see, as she couldn't answer either question, it didn't much matter which way she put it. She felt that she was dozing off, and had just begun to dream that she was walking hand in hand with Dinah, and saying to her very earnestly, 'Now, Dinah, tell me the truth: did you ever eat a bat?' when suddenly, thump! thump! down she came upon a heap of sticks and dry leaves, and the fall was over.

`;

export const STARTERS: Starter[] = [
  {
    id: "document",
    icon: "document",
    title: "Continue a long document",
    description:
      "The first pages of Alice's Adventures in Wonderland, about 1,200 tokens. Watch the KV cache grow as the model reads them: past 512 tokens only the full-attention layers keep growing. Then it writes on.",
    prompt: ALICE_OPENING,
    document: "Alice's Adventures in Wonderland, chapter I",
  },
  {
    id: "switch",
    icon: "switch",
    title: "Switch the cache mid-answer",
    description:
      "Starts a story in FP16, then re-encodes its KV cache as the suggested TurboQuant preset (keys at 4 bits, values at 3) after 16 tokens, while the story goes on. The timeline marks the switch and the bytes it saved.",
    prompt:
      "The old lighthouse keeper had kept a logbook for forty years. On the last page, in handwriting that grew smaller and smaller, she wrote down the story of the night the ship came in without a crew. It began like this:",
    from: "default_spec",
    switchTo: "suggested_spec",
    switchAfter: 16,
  },
];
