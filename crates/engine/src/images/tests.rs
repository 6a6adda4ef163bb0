use std::sync::Arc;

use super::*;

const TOKENS: ImageTokens = ImageTokens {
    begin: 500,
    soft: 501,
    end: 502,
};

fn image(id: &str, soft_tokens: usize) -> Arc<PreparedImage> {
    Arc::new(PreparedImage {
        id: id.into(),
        patches: Patches {
            values: vec![0.0; soft_tokens * 9 * 48],
            positions: vec![(0, 0); soft_tokens * 9],
            size: (12, 12),
            original: (12, 12),
            soft_tokens,
        },
    })
}

#[test]
fn each_marker_widens_to_its_images_places_in_order() {
    let ids = [2, 10, 501, 11, 501, 12];
    let (out, placed) = place(&ids, TOKENS, &[image("a", 3), image("b", 2)]).expect("placed");
    assert_eq!(
        out,
        [2, 10, 500, 501, 501, 501, 502, 11, 500, 501, 501, 502, 12]
    );
    assert_eq!(
        placed,
        [
            PromptImage {
                at: 3,
                len: 3,
                id: "a".into()
            },
            PromptImage {
                at: 9,
                len: 2,
                id: "b".into()
            }
        ]
    );
    // Markers and images that disagree are refused, either way.
    for (ids, n) in [
        (&[2, 501, 501][..], 1),
        (&[2, 10][..], 1),
        (&[2, 501][..], 2),
    ] {
        let images: Vec<_> = (0..n).map(|k| image(&k.to_string(), 2)).collect();
        let err = place(ids, TOKENS, &images).expect_err("mismatch");
        assert!(matches!(err, ImageError::Mismatch(_)), "{err}");
    }
}

#[test]
fn another_image_in_the_same_places_is_never_reused() {
    let (ids, a) = place(&[2, 501, 7, 8], TOKENS, &[image("a", 3)]).expect("a");
    let (same_ids, b) = place(&[2, 501, 7, 9], TOKENS, &[image("b", 3)]).expect("b");
    // The ids agree up to the last token; the images do not: reuse stops before image b.
    assert_eq!(ids[..6], same_ids[..6]);
    assert_eq!(common_prefix((&ids, &a), (&same_ids, &b)), 2);
    // The same image: everything the ids share.
    let (again, a2) = place(&[2, 501, 7, 9], TOKENS, &[image("a", 3)]).expect("a again");
    assert_eq!(common_prefix((&ids, &a), (&again, &a2)), 7);
    // A prompt that gains an image where the cache held text reuses the text before it.
    assert_eq!(common_prefix((&[2, 500, 501], &[]), (&again, &a2)), 2);
    // Never inside an image, whatever the ids say.
    assert_eq!(cut_outside(4, &a), 2);
    assert_eq!(cut_outside(5, &a), 5);
    assert_eq!(cut_outside(2, &a), 2);
}

#[test]
fn the_store_keeps_its_bounds_and_forgets_the_oldest() {
    let mut store = ImageStore::default();
    for k in 0..MAX_IMAGES + 5 {
        let img = Arc::try_unwrap(image(&format!("{k}"), 1)).expect("one owner");
        store.insert(img);
    }
    assert_eq!(store.images.len(), MAX_IMAGES);
    assert!(store.get("0").is_none() && store.get("4").is_none());
    assert!(store.get("5").is_some());
    assert_eq!(image_id(b"x").len(), 32);
    assert_ne!(image_id(b"x"), image_id(b"y"));
}
